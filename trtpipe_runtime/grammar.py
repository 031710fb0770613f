"""Guided decoding (structured output) for the Python-backend runtimes: the guide a request sends, validated the
way every runtime accepts it, and, for the portable runtime, the grammar that masks its logits.

A request constrains its answer with two optional STRING [1] inputs, the TensorRT-LLM C++ backend's
``guided_decoding_guide_type`` and ``guided_decoding_guide`` (triton_backend/inflight_batcher_llm/src/utils.cc
maps the type strings below onto executor ``GuidedDecodingParams::GuideType``; recorded in
tests/facts/trtllm_1_2_1/guided_decoding.json). Upstream silently ignores a type string it does not know; here
it is refused, naming the types. The grammar engine is xgrammar (the release TensorRT-LLM 1.2 pins, 0.1.25), so
the portable runtime on a CPU and TensorRT-LLM on a GPU accept and constrain the same requests.

The portable runtime masks each guided row of the logits with xgrammar's token bitmask before sampling
(``GrammarMatcher.fill_next_token_bitmask``, one bit per token id, int32 words); the bits are unpacked with
torch on the logits' own device, so no xgrammar kernel (CUDA JIT or Triton) is needed. JSON is compiled with
``any_whitespace=False`` (one line, ``", "`` and ``": "`` separators): with free whitespace a model can spend
its whole max_tokens on newlines inside a value, which small models do.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from .decoding import DecodingError

GUIDE_TYPES: tuple[str, ...] = ("json", "json_schema", "regex", "ebnf_grammar")
"""The guide types of TensorRT-LLM's Triton backend (utils.cc), in its order: ``json`` is any JSON object (no
guide text needed; upstream's built-in JSON grammar also allows a top-level array), ``json_schema`` a JSON Schema, ``regex`` a regular expression, ``ebnf_grammar`` an
EBNF grammar whose start rule is ``root`` (xgrammar's GBNF dialect)."""

JSON_OBJECT_SCHEMA = '{"type": "object"}'
"""The grammar of guide type ``json`` (OpenAI's ``json_object``: any JSON object)."""

MAX_GUIDE_BYTES = 256 * 1024
"""The largest guide a request may send (bytes of UTF-8): a grammar larger than this is refused before it is
compiled, so one request cannot make the engine compile for minutes."""

GRAMMAR_BACKENDS: tuple[str, ...] = ("xgrammar",)
"""The guided-decoding backends the portable runtime has (TensorRT-LLM's LLM API also names llguidance)."""


def _engine_message(exc: Exception) -> str:
    """xgrammar's error text without its C++ log prefix (``[hh:mm:ss] /project/cpp/file.cc:NN: ``) and its
    ``Check failed: (...) is false:`` assertion wrapper."""
    text = str(exc).strip()
    text = re.sub(r"^\[[0-9:]+\]\s+\S+:\d+:\s*", "", text)
    text = re.sub(r"^Check failed: \(.*?\) is false:\s*", "", text)
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Guide:
    """One request's validated guide: ``kind`` one of :data:`GUIDE_TYPES`, ``text`` the guide ('' for json)."""

    kind: str
    text: str = ""


def parse_guide(guide_type, guide) -> Optional[Guide]:
    """Validate a request's guided-decoding inputs (strings or bytes; None where absent).

    Returns None when the request sent no guide type (or an empty one). The guide's syntax is checked by
    xgrammar's own parsers (``Grammar.from_json_schema`` / ``from_regex`` / ``from_ebnf``), which need no
    tokenizer, so a bad schema is refused before the request reaches the engine.

    Raises:
        DecodingError: an unknown guide type, a missing, oversized or invalid guide (naming it and the rule),
            or xgrammar not installed.
    """
    kind = _text(guide_type).strip()
    text = _text(guide)
    if not kind:
        if text.strip():
            raise DecodingError("guided_decoding_guide is set but guided_decoding_guide_type is not: send the type "
                                f"too, one of {', '.join(GUIDE_TYPES)}")
        return None
    if kind not in GUIDE_TYPES:
        raise DecodingError(f"guided_decoding_guide_type = {kind!r}: not a guide type; send one of "
                            f"{', '.join(GUIDE_TYPES)} (TensorRT-LLM's Triton backend names)")
    if len(text.encode("utf-8")) > MAX_GUIDE_BYTES:
        raise DecodingError(f"guided_decoding_guide holds {len(text.encode('utf-8'))} bytes, above the limit of "
                            f"{MAX_GUIDE_BYTES}: send a smaller {kind.replace('_', ' ')}")
    if kind == "json":
        return Guide(kind, "")
    if not text.strip():
        raise DecodingError(f"guided_decoding_guide_type = {kind!r} needs guided_decoding_guide: send the "
                            f"{kind.replace('_', ' ')} itself")
    xgr = _xgrammar()
    try:
        if kind == "json_schema":
            schema = json.loads(text)
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"a JSON Schema is an object (or true/false), not {type(schema).__name__}")
            xgr.Grammar.from_json_schema(text)
        elif kind == "regex":
            xgr.Grammar.from_regex(text)
        else:
            xgr.Grammar.from_ebnf(text)
    except json.JSONDecodeError as exc:
        raise DecodingError(f"guided_decoding_guide: the json_schema is not valid JSON ({exc}): send a JSON "
                            "Schema object") from None
    except Exception as exc:  # xgrammar raises RuntimeError with the parser's message
        raise DecodingError(f"guided_decoding_guide: invalid {kind.replace('_', ' ')}: {_engine_message(exc)}") \
            from None
    return Guide(kind, text)


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise DecodingError("guided decoding needs the xgrammar package (xgrammar==0.1.25, the release "
                            "TensorRT-LLM 1.2 pins) in the server's Python: run `make setup`") from None
    return xgrammar


@dataclass
class GrammarStats:
    """Counters of one :class:`Grammars` (since the runtime started).

    Attributes:
        compiles: grammars compiled (cache misses).
        hits: requests whose grammar was already compiled.
        compile_seconds: wall seconds spent compiling.
    """

    compiles: int = 0
    hits: int = 0
    compile_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        total = self.compiles + self.hits
        return self.hits / total if total else 0.0


@dataclass
class Grammars:
    """The portable runtime's grammar engine: xgrammar's GrammarCompiler over the model's tokenizer, with a
    compiled-grammar cache keyed by (kind, text).

    Args:
        tokenizer_dir: the folder with the model's tokenizer files (the engine folder).
        vocab_size: the model's vocabulary (config.json ``vocab_size``: the logits' width, which may exceed
            the tokenizer's).
        stop_token_ids: the ids that end an answer (generation_config.json's eos list); a finished grammar
            allows only these.
    """

    tokenizer_dir: str
    vocab_size: int
    stop_token_ids: list = field(default_factory=list)
    max_threads: int = 2
    stats: GrammarStats = field(default_factory=GrammarStats)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._compiler = None
        self._cache: dict = {}

    def _get_compiler(self):
        if self._compiler is None:
            xgr = _xgrammar()
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
            info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size,
                                                      stop_token_ids=list(self.stop_token_ids) or None)
            self._compiler = xgr.GrammarCompiler(info, max_threads=self.max_threads, cache_enabled=False)
        return self._compiler

    def compiled(self, guide: Guide):
        """The compiled grammar of ``guide`` (cached).

        Raises:
            DecodingError: xgrammar could not compile it.
        """
        key = (guide.kind, guide.text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self.stats.hits += 1
                return hit
            compiler = self._get_compiler()
            start = time.perf_counter()
            try:
                if guide.kind == "json":
                    out = compiler.compile_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
                elif guide.kind == "json_schema":
                    out = compiler.compile_json_schema(guide.text, any_whitespace=False)
                elif guide.kind == "regex":
                    out = compiler.compile_regex(guide.text)
                else:
                    out = compiler.compile_grammar(guide.text)
            except Exception as exc:
                raise DecodingError(f"guided_decoding_guide: xgrammar could not compile the "
                                    f"{guide.kind.replace('_', ' ')}: {_engine_message(exc)}") from None
            self.stats.compile_seconds += time.perf_counter() - start
            self.stats.compiles += 1
            self._cache[key] = out
            return out

    def matcher(self, guide: Guide, end_ids=()):
        """A new :class:`Matcher` for one sequence; ``end_ids``: the request's end ids inside the vocabulary
        (they end the answer once the grammar is complete; the model's stop ids where none)."""
        xgr = _xgrammar()
        stops = [int(t) for t in end_ids if 0 <= int(t) < self.vocab_size] or None
        return Matcher(xgr.GrammarMatcher(self.compiled(guide), override_stop_tokens=stops), self.vocab_size)


class Matcher:
    """One sequence's grammar state: tokens accepted so far and the mask of the next token."""

    def __init__(self, matcher, vocab_size: int):
        self._m = matcher
        self.vocab_size = vocab_size
        self.accepted = 0  # generated tokens fed to the matcher
        self.broken = False  # a token the grammar refused was generated (the mask was bypassed): stop masking
        self._bitmask = None
        self._shifts = None

    def advance(self, generated) -> None:
        """Feed the tokens generated since the last call (``generated``: all generated ids of the sequence)."""
        for token in generated[self.accepted:]:
            self.accepted += 1
            if self.broken or self._m.is_terminated():
                continue
            if not self._m.accept_token(int(token)):
                self.broken = True

    def mask_(self, row) -> None:
        """Set to -inf, in place, every logit of ``row`` ([vocab] tensor) the grammar does not allow next."""
        if self.broken:
            return
        import torch
        import xgrammar as xgr

        if self._bitmask is None:
            self._bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        if self._m.is_terminated():
            return  # complete: the request's end id was generated; nothing follows
        self._m.fill_next_token_bitmask(self._bitmask)
        words = self._bitmask[0].to(row.device)
        if self._shifts is None or self._shifts.device != row.device:
            self._shifts = torch.arange(32, dtype=torch.int32, device=row.device)
        allowed = ((words.unsqueeze(-1) >> self._shifts) & 1).flatten()[:row.size(-1)].bool()
        row.masked_fill_(~allowed, float("-inf"))
