"""What each request sends: prompts and output lengths.

Synthetic prompts are built with the served model's tokenizer (from the engine folder next
to the repository) so their input lengths are exact in the model's tokens; each starts with
the request's index, so no two share a prefix and KV-cache reuse stays off unless asked
for. A JSONL dataset gives real prompts instead. Everything is seeded. Input lengths are
counted with the tokenizer the way preprocessing does (special tokens included); output
lengths are never counted here: the server's ``num_output_tokens`` does that.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plugins.errors import PipelineError, Problem, SpecError

log = logging.getLogger("trtpipe")
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


@dataclass(frozen=True)
class RequestSpec:
    """One request's payload."""

    prompt: str
    input_tokens: int
    max_tokens: int
    shared_prefix: str = ""
    """Text every request of its group starts with (the shared-prefix workload): the chat endpoint sends it as the
    system message, the others put it before ``prompt``. ``input_tokens`` counts both."""
    model: str = ""
    """The model it asks for (``--models``: the base model by its build name, or a LoRA adapter); "" : the run's
    own (LoadTestConfig.model)."""

    @property
    def text(self) -> str:
        """The whole prompt as one text (what the Triton and completions endpoints send)."""
        return self.shared_prefix + self.prompt


@dataclass
class Workload:
    """The requests of one run, in send order, and how they were made."""

    requests: list[RequestSpec]
    description: dict


def parse_length(text: str | int) -> tuple[str, tuple[float, ...]]:
    """``128`` | ``uniform:LO:HI`` | ``normal:MEAN:STD`` -> (kind, params); raises ValueError with the forms."""
    s = str(text).strip()
    try:
        if s.isdigit():
            return "fixed", (int(s),)
        kind, *params = s.split(":")
        vals = tuple(float(p) for p in params)
        if kind == "uniform" and len(vals) == 2 and 1 <= vals[0] <= vals[1]:
            return kind, vals
        if kind == "normal" and len(vals) == 2 and vals[0] >= 1 and vals[1] >= 0:
            return kind, vals
    except ValueError:
        pass
    raise ValueError(f"length {text!r}: use N (fixed), uniform:LO:HI or normal:MEAN:STD with lengths >= 1")


def sample_lengths(spec: str | int, n: int, rng: np.random.Generator) -> list[int]:
    kind, p = parse_length(spec)
    if kind == "fixed":
        return [int(p[0])] * n
    if kind == "uniform":
        return [int(x) for x in rng.integers(int(p[0]), int(p[1]) + 1, size=n)]
    return [max(1, int(round(x))) for x in rng.normal(p[0], p[1], size=n)]


class WordTokenizer:
    """Stand-in when the served model has no tokenizer (the trivial model): one word = one token."""

    name = "words (no tokenizer folder: not the model's tokens)"
    vocab_size = None

    def count(self, text: str) -> int:
        return len(text.split())

    def synth(self, index: int, n: int, rng: np.random.Generator, lead: str | None = None) -> str:
        head = (lead or f"request-{index}").split()
        words = head + [WORDS[i] for i in rng.integers(0, len(WORDS), size=max(n - len(head), 0))]
        return " ".join(words[:max(n, 1)])


class HFTokenizer:
    """The served model's tokenizer (transformers, offline)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        # A load test counts tokens and never runs a tokenizer's own code (transformers refuses one that needs it).
        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        self.name = str(folder)
        cfg = folder / "config.json"
        vs = json.loads(cfg.read_text()).get("vocab_size") if cfg.is_file() else None
        self.vocab_size = int(vs or len(self.tok))
        toks = self.tok.convert_ids_to_tokens(list(range(len(self.tok))))
        # Whole words with a leading-space marker decode and re-encode stably.
        self.pool = np.array([i for i, t in enumerate(toks)
                              if t and t[0] in "Ġ▁" and t[1:].isalpha() and t[1:].isascii() and len(t) > 2])
        if self.pool.size < 100:
            self.pool = np.arange(len(self.tok))

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=True))

    def synth(self, index: int, n: int, rng: np.random.Generator, lead: str | None = None) -> str:
        """About ``n`` tokens (exactly, but for tiny ``n``): ``lead`` (default ``Request <index>:``), then random
        whole words."""
        prefix = lead or f"Request {index}:"
        ids = list(rng.choice(self.pool, size=max(n, 1)))
        text = prefix
        for _ in range(4):  # trim until the re-encoded prompt has exactly n tokens (or fewer when n is tiny)
            text = prefix + self.tok.decode(ids)
            extra = self.count(text) - n
            if extra <= 0 or not ids:
                break
            ids = ids[:max(len(ids) - extra, 0)]
        return text


def load_tokenizer(folder: Path | None):
    """The tokenizer in ``folder``, or the word stand-in (a warning line) when there is none."""
    if folder is not None and (Path(folder) / "tokenizer_config.json").is_file():
        return HFTokenizer(Path(folder))
    where = f"no tokenizer_config.json in {folder}" if folder is not None else "no tokenizer folder"
    log.warning("warning: %s: input lengths are counted in words, not the model's tokens (fine for the trivial "
                "model only; pass --tokenizer with the model's tokenizer folder)", where)
    return WordTokenizer()


def synthetic(n: int, input_len: str, output_len: str, tokenizer, seed: int = 0, offset: int = 0,
              shared_prefixes: int = 0, shared_prefix_len: int = 0) -> Workload:
    """``n`` unique prompts with lengths drawn from ``input_len``/``output_len`` (see :func:`parse_length`).

    With ``shared_prefixes`` N > 0, request i starts with prefix i mod N, one of N distinct texts of
    ``shared_prefix_len`` tokens (a system prompt: what prefix caching reuses), then its unique part of
    ``input_len`` tokens. The prefixes do not depend on ``seed``: every point and every run shares them.
    """
    rng = np.random.default_rng(seed)
    ins, outs = sample_lengths(input_len, n, rng), sample_lengths(output_len, n, rng)
    prefixes = [_prefix(tokenizer, j, shared_prefix_len) for j in range(shared_prefixes)]
    reqs = []
    for i, (a, b) in enumerate(zip(ins, outs)):
        text = tokenizer.synth(offset + i, a, rng)
        prefix = prefixes[i % len(prefixes)] if prefixes else ""
        reqs.append(RequestSpec(text, tokenizer.count(prefix + text), b, prefix))
    desc = {"kind": "synthetic", "input_len": str(input_len), "output_len": str(output_len), "seed": seed,
            "tokenizer": tokenizer.name, "unique_prompts": True}
    if prefixes:
        desc.update(shared_prefixes=len(prefixes), shared_prefix_len=shared_prefix_len,
                    shared_prefix_tokens=[tokenizer.count(x) for x in prefixes])
    return Workload(reqs, desc)


def _prefix(tokenizer, j: int, n: int) -> str:
    """Shared prefix ``j``: about ``n`` tokens, the same for every run (its own seeded generator)."""
    return tokenizer.synth(j, n, np.random.default_rng(10**6 + j), lead=f"System prompt {j}:") + "\n"


PROMPT_KEYS = ("prompt", "text_input", "text", "input")
OUTPUT_KEYS = ("output_len", "max_tokens", "output_tokens")


def read_jsonl(path: Path) -> list[tuple[str, int | None]]:
    """(prompt, output length in tokens or None) of every non-empty line of a JSONL dataset: one object a line with
    a prompt field (``PROMPT_KEYS``, a string) and optionally an output length field (``OUTPUT_KEYS``, a whole
    number of tokens >= 1; null: not given). Raises SpecError naming every bad line at once."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"dataset {path} not found: pass a JSONL file with one {{\"prompt\": ...}} a line")
    example = '{"prompt": "Hello", "output_len": 64}'
    rows, problems = [], []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(Problem(where, _clip(line), f"not JSON ({exc})", f"write one JSON object a line, e.g. "
                                    f"{example}", code="dataset_not_json"))
            continue
        if not isinstance(obj, dict):
            problems.append(Problem(where, _clip(obj), f"a JSON {type(obj).__name__}, not an object",
                                    f"write one JSON object a line, e.g. {example}", code="dataset_not_object"))
            continue
        prompt = next((obj[k] for k in PROMPT_KEYS if isinstance(obj.get(k), str)), None)
        if prompt is None:
            key = next((k for k in PROMPT_KEYS if k in obj), None)
            problems.append(Problem(f"{key} ({where})", _clip(obj[key]), "a prompt must be a string",
                                    "write the prompt text as a JSON string", code="dataset_prompt") if key else
                            Problem(where, _clip(obj), f"no prompt field (one of {', '.join(PROMPT_KEYS)})",
                                    f"add one, e.g. {example}", code="dataset_no_prompt"))
            continue
        key = next((k for k in OUTPUT_KEYS if obj.get(k) is not None), None)
        out = obj[key] if key else None
        if key and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            problems.append(Problem(f"{key} ({where})", out, "an output length must be a whole number of tokens "
                                    ">= 1", f"write e.g. \"{key}\": 64, or drop it to take --output-len",
                                    code="dataset_output_len"))
            continue
        rows.append((prompt, out))
    if problems:
        raise SpecError(problems, str(path), what="the dataset")
    if not rows:
        raise PipelineError(f"{path}: no prompts")
    return rows


def _clip(value, n: int = 80):
    """``value`` as it reads in an error: long texts cut to ``n`` characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return value if len(text) <= n else text[:n] + "..."


def from_jsonl(path: Path, n: int, output_len: str, tokenizer, seed: int = 0) -> Workload:
    """``n`` requests from a JSONL file (see :func:`read_jsonl`; lines without an output length take
    ``output_len``).

    Prompts are shuffled with ``seed`` and reused in order when ``n`` exceeds the file.
    """
    rows = read_jsonl(path)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    outs = sample_lengths(output_len, n, rng)
    reqs = []
    for i in range(n):
        prompt, out = rows[order[i % len(rows)]]
        reqs.append(RequestSpec(prompt, tokenizer.count(prompt), out or outs[i]))
    return Workload(reqs, {"kind": "dataset", "path": str(path), "rows": len(rows), "output_len": str(output_len),
                           "seed": seed, "tokenizer": tokenizer.name})
