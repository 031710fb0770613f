"""OpenAI ``logprobs`` from the runtime's token ids and log probabilities, for the OpenAI frontend.

One job: turn what the runtime returns per token (its id, its log probability, the k most likely ids and theirs:
the ``output_token_ids`` / ``output_log_probs`` / ``top_*`` / ``prompt_*`` tensors) into the shapes of OpenAI's API
reference: chat's ``choices[i].logprobs.content[j] = {token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}`` (:func:`chat_content`) and completions' ``choices[i].logprobs = {tokens, token_logprobs, top_logprobs:
[{token: logprob}], text_offset}`` (:func:`completion_logprobs`).

Token strings follow vLLM (``convert_ids_list_to_tokens`` in vllm/tokenizers/detokenizer_utils.py; the chat
``bytes`` of its OpenAI server): each token is decoded alone with the model's tokenizer (``tokenizer.decode([id])``,
special tokens kept), so a byte-level BPE token holding part of a character's UTF-8 bytes (a CJK character or an
emoji spelt by two or more tokens) reads ``"\\ufffd"`` and its ``bytes`` are the UTF-8 of that string, ``[239, 191,
189]``, not the token's own bytes (which OpenAI's API gives). The text of the answer is unaffected: it is
detokenized as a whole. Log probabilities below -9999 (``-inf`` for a token a penalty or bad word banned) are sent
as -9999.0, as vLLM does: JSON has no infinity. Completions' ``top_logprobs`` hold the k most likely tokens and the
token itself (up to k + 1 entries, as OpenAI documents); chat's exactly the k most likely. The first token of a
prompt has no log probability: ``null`` (OpenAI, vLLM). ``text_offset`` is each token's offset into the choice's
text counted in the characters of these token strings, as vLLM counts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

FLOOR = -9999.0
"""The lowest log probability sent (vLLM's): ``-inf`` and anything below become this."""


def _value(lp: float) -> float:
    return max(float(lp), FLOOR)


@dataclass
class TokenLogprobs:
    """Log probabilities of a run of tokens: ``logprobs[j]`` of token ``ids[j]`` (None: the prompt's first token),
    ``top_ids[j]`` / ``top_logprobs[j]`` its k most likely alternatives, most likely first (None where
    ``logprobs[j]`` is None; empty lists when k is 0)."""

    ids: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    top_ids: list = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, other: "TokenLogprobs") -> None:
        for name in ("ids", "logprobs", "top_ids", "top_logprobs"):
            getattr(self, name).extend(getattr(other, name))

    def __getitem__(self, s: slice) -> "TokenLogprobs":
        return TokenLogprobs(self.ids[s], self.logprobs[s], self.top_ids[s], self.top_logprobs[s])

    @classmethod
    def of(cls, ids, logprobs, top_ids=None, top_logprobs=None) -> "TokenLogprobs":
        """From the runtime's arrays (lists or numpy): ``ids`` [n], ``logprobs`` [n], ``top_ids`` / ``top_logprobs``
        [n, k] (None: no alternatives). ValueError when their lengths disagree."""
        ids, logprobs = [int(i) for i in ids], [float(x) for x in logprobs]
        n = len(ids)
        top_ids = [[int(i) for i in row] for row in top_ids] if top_ids is not None else [[] for _ in range(n)]
        top_logprobs = [[float(x) for x in row] for row in top_logprobs] if top_logprobs is not None \
            else [[] for _ in range(n)]
        if not len(logprobs) == len(top_ids) == len(top_logprobs) == n or any(
                len(a) != len(b) for a, b in zip(top_ids, top_logprobs)):
            raise ValueError(f"{n} token ids, {len(logprobs)} log probabilities and {len(top_ids)} rows of "
                             "alternatives: the runtime's log probabilities do not match its tokens")
        return cls(ids, logprobs, top_ids, top_logprobs)

    @classmethod
    def prompt(cls, ids, logprobs, top_ids=None, top_logprobs=None) -> "TokenLogprobs":
        """A prompt's: ``ids`` [n] and the runtime's prompt_log_probs [n - 1] (and prompt_top_* [n - 1, k]) of the
        tokens after the first, which gets None. ValueError when the counts disagree."""
        ids = [int(i) for i in ids]
        if len(logprobs) != max(len(ids) - 1, 0):
            raise ValueError(f"the runtime scored {len(logprobs)} prompt tokens after the first, the prompt has "
                             f"{len(ids)}: the frontend and the preprocessing model tokenize differently")
        rest = cls.of(ids[1:], logprobs, top_ids, top_logprobs)
        return cls(ids[:1] + rest.ids, [None] * len(ids[:1]) + rest.logprobs, [None] * len(ids[:1]) + rest.top_ids,
                   [None] * len(ids[:1]) + rest.top_logprobs)


class TokenTexts:
    """Token id -> its string, decoded alone with the model's tokenizer (vLLM's rule; module docstring), cached."""

    def __init__(self, tok: Any):
        self.tok = tok
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tok.decode([token_id]) or ""
        return text


def _entry(texts: TokenTexts, token_id: int, lp: float) -> dict:
    token = texts(token_id)
    return {"token": token, "logprob": _value(lp), "bytes": list(token.encode("utf-8", errors="replace"))}


def chat_content(texts: TokenTexts, lp: TokenLogprobs, k: int) -> list[dict]:
    """Chat's ``logprobs.content`` entries for the tokens of ``lp``, each with its ``k`` most likely alternatives."""
    out = []
    for j, token_id in enumerate(lp.ids):
        entry = _entry(texts, token_id, lp.logprobs[j])
        entry["top_logprobs"] = [_entry(texts, t, v) for t, v in zip(lp.top_ids[j][:k], lp.top_logprobs[j][:k])]
        out.append(entry)
    return out


def completion_logprobs(texts: TokenTexts, lp: TokenLogprobs, k: int, offset: int = 0) -> dict:
    """Completions' ``logprobs`` object for the tokens of ``lp``: their strings, log probabilities (None for a
    prompt's first token), ``{token: logprob}`` of the ``k`` most likely and the token itself, and each token's
    offset into the choice's text, the first at ``offset``."""
    tokens, values, tops, offsets = [], [], [], []
    for j, token_id in enumerate(lp.ids):
        token = texts(token_id)
        offsets.append(offset)
        offset += len(token)
        tokens.append(token)
        if lp.logprobs[j] is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_value(lp.logprobs[j]))
        top: dict = {}
        for t, v in zip(lp.top_ids[j][:k], lp.top_logprobs[j][:k]):
            top.setdefault(texts(t), _value(v))  # two ids of one string (two "\ufffd"): the more likely one's
        top.setdefault(token, values[-1])
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
