"""The OpenAI frontend's size limits, checked before anything costly runs: the request body, then the prompt.

One job: refuse what cannot be served before it is read whole or tokenized.

* The body (:func:`read_body`): at most ``max_body_bytes`` (default :func:`default_max_body_bytes`: 1 MiB for the
  request's framing, messages, tools and schemas, plus :data:`BODY_BYTES_PER_TOKEN` per token of ``max_input_len``).
  A ``Content-Length`` over it is refused before a byte is read; a body sent without one (chunked) is counted as it
  arrives and refused as soon as it passes the limit. 413 ``request_too_large``.
* The prompt (:func:`prompt_char_limit`): each token of these tokenizers stands for at most ``L`` characters of the
  text, ``L`` the longest entry of the vocabulary (added tokens included), so a prompt of more than
  ``max_input_len x L`` characters has more than ``max_input_len`` tokens and is refused (400
  ``context_length_exceeded``) without running the tokenizer. That holds for a tokenizer that loses no character
  of the text on its way to the model: no normalizer, or one that only adds, replaces one character by one or more
  (Llama-2's ``Replace(" ", "▁")``), decomposes or lower-cases; ``NFC`` / ``NFKC`` compose at most 4 code points into
  one (the longest canonical decomposition in Unicode is 4 code points: checked by the tests over every code point of
  Python's unicodedata), so ``L`` is taken 4 times for them; pre-tokenizers that keep every character (ByteLevel,
  Metaspace, Split / Punctuation that do not remove, Digits); a BPE or Unigram model that never folds several unknown
  characters into one token (``byte_fallback``, or no ``fuse_unk``); no added token that strips the spaces beside it.
  For any other tokenizer (WordPiece, whitespace-dropping pre-tokenizers, ...) there is no such bound
  (:func:`prompt_char_limit` returns None) and the body limit is the only one before tokenizing.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pipeline.openai_errors import APIError

BODY_BASE_BYTES = 1 << 20
"""What any request may take besides its prompt: framing, message roles, tools and their schemas, response formats."""
BODY_BYTES_PER_TOKEN = 64
"""Body bytes allowed per prompt token: room for 16 characters per token, each sent as a 4-byte UTF-8 character (a
JSON ``\\uXXXX`` escape takes 6 bytes for one that is 2 or 3 bytes in UTF-8, still within 16 x 4 on average for
text), or for a token-id prompt (at most 7 bytes an id: ``123456,``)."""
NFC_SHRINK = 4
"""The most code points NFC / NFKC composes into one (Unicode's longest canonical decomposition: 4)."""


def default_max_body_bytes(max_input_len: int) -> int:
    """The body limit for a model of ``max_input_len`` tokens (bytes): BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN x
    max_input_len. Several prompts in one completion request share it: 413 tells the client to split them."""
    return BODY_BASE_BYTES + BODY_BYTES_PER_TOKEN * max_input_len


def _too_large(limit: int, size: Optional[int]) -> APIError:
    said = f"{size} bytes" if size is not None else "more"
    return APIError(413, f"the request body is {said}; this server takes at most {limit} bytes (its --max-body-bytes,"
                         " by default 1 MiB + 64 bytes per token of max_input_len): send a shorter prompt, or fewer "
                         "prompts per request", code="request_too_large")


async def read_body(request, limit: int) -> bytes:
    """The body of a Starlette ``request``, at most ``limit`` bytes. APIError 413 when ``Content-Length`` says more
    (nothing is read) or when more arrives (reading stops there); 400 for a ``Content-Length`` that is not a
    number."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise APIError(400, f"Content-Length {declared!r} is not a number of bytes") from None
        if size > limit:
            raise _too_large(limit, size)
    chunks, got = [], 0
    async for chunk in request.stream():
        got += len(chunk)
        if got > limit:
            raise _too_large(limit, None)
        chunks.append(chunk)
    return b"".join(chunks)


# ---- prompt length before tokenizing ---------------------------------------------------------------------------

_KEEPS = {"Prepend": 1, "NFD": 1, "NFKD": 1, "Lowercase": 1, "NFC": NFC_SHRINK, "NFKC": NFC_SHRINK}
"""Normalizers that lose no character, with the most input characters one output character may stand for."""
_PRE_KEEPS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}
_PRE_KEEPS_UNLESS_REMOVED = {"Split", "Punctuation"}  # (CharDelimiterSplit always removes its delimiter)


def _normalizer_factor(spec: Optional[dict]) -> Optional[int]:
    """How many input characters one normalized character may stand for (1: none lost); None: unbounded or unknown."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for part in spec.get("normalizers", []):
            f = _normalizer_factor(part)
            if f is None:
                return None
            factor *= f
        return factor
    if kind == "Replace":  # a one-character pattern replaced by one or more characters loses nothing
        pattern = (spec.get("pattern") or {}).get("String")
        return 1 if isinstance(pattern, str) and len(pattern) == 1 and spec.get("content") else None
    return _KEEPS.get(kind)


def _pre_tokenizer_keeps(spec: Optional[dict]) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_keeps(p) for p in spec.get("pretokenizers", []))
    if kind in _PRE_KEEPS_UNLESS_REMOVED:
        return str(spec.get("behavior", "")).lower() != "removed"
    return kind in _PRE_KEEPS


def _model_keeps(spec: dict) -> bool:
    if spec.get("type") not in ("BPE", "Unigram"):
        return False  # WordPiece folds a long word into [UNK]; WordLevel maps any unknown word to one token
    return bool(spec.get("byte_fallback")) or not spec.get("fuse_unk", spec.get("type") == "Unigram")


def longest_token_chars(tok: Any) -> Optional[int]:
    """The most characters of prompt text one token of ``tok`` (a transformers fast tokenizer) may stand for: the
    longest vocabulary entry (added tokens included) times the normalizer's factor; None when the tokenizer is not
    one for which that bound holds (module docstring) or has no fast backend."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    factor = _normalizer_factor(spec.get("normalizer"))
    if factor is None or not _pre_tokenizer_keeps(spec.get("pre_tokenizer")) or not _model_keeps(spec["model"]):
        return None
    if any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens", [])):
        return None  # such a token swallows any run of spaces beside it
    vocab = backend.get_vocab(with_added_tokens=True)
    return max(1, max((len(t) for t in vocab), default=1)) * factor


def prompt_char_limit(tok: Any, max_input_len: int) -> Optional[int]:
    """The most characters a prompt of at most ``max_input_len`` tokens can have with ``tok`` (a longer one is
    refused untokenized); None: no such bound for this tokenizer (:func:`longest_token_chars`)."""
    per_token = longest_token_chars(tok)
    return None if per_token is None else per_token * max_input_len
