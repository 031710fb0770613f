"""Incremental detokenization: streamed token ids -> text that never splits a character.

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM) spells a CJK character, an emoji or many accented
letters with two or more tokens, each holding part of its UTF-8 bytes; decoding a streamed chunk on its own turns
those parts into U+FFFD. :class:`IncrementalDetokenizer` keeps the ids a stream has produced and decodes a short
window of them each time: the text the new ids add is emitted once it no longer ends in U+FFFD, and held back until
then (the rule of vLLM's ``detokenize_incrementally`` in vllm/transformers_utils/detokenizer_utils.py and of
transformers' ``TextStreamer``). The emitted pieces, joined, equal ``decode(all ids)`` (less a last character
the generation cut in half) for the tokenizers whose decode of a window depends only on that window (byte-level
BPE; SentencePiece with byte fallback), as tests/trtpipe_runtime/test_detokenize.py checks on the shipped one.

Used by the postprocessing and tensorrt_llm_bls models (one per streamed request). :class:`Utf8Joiner` does the
same for clients that receive bytes (the OpenAI frontend, ``trtpipe query``); :class:`StopMatcher` matches stop
strings on the text (the OpenAI frontend). Standard library only: the caller passes its tokenizer's
``batch_decode``.
"""

from __future__ import annotations

import codecs
from typing import Callable, Iterable, Sequence

REPLACEMENT = "\ufffd"
"""What a decode gives for bytes that are not (yet) a whole UTF-8 character."""


MAX_CHAR_TOKENS = 3
"""The most trailing ids held back for one incomplete character (UTF-8 spells one in at most 4 bytes; one byte per
token at worst, the last of which completes it)."""


class IncrementalDetokenizer:
    """One stream's detokenizer.

    Args:
        batch_decode: windows of token ids (list[list[int]]) -> their texts (list[str]), the tokenizer's own
            ``batch_decode`` with its skip_special_tokens choice (one call a step; a second while a character
            is incomplete).

    ``push(ids)`` returns the new text: everything up to the last whole character. The ids of a character not yet
    whole (at most MAX_CHAR_TOKENS of them) wait for the next push; a character the generation cuts in half is
    never sent (as vLLM's detokenizer), so a stream and a one-response answer carry the same text.
    """

    def __init__(self, batch_decode: Callable[[list[list[int]]], list[str]]):
        self._batch_decode = batch_decode
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here: ids already emitted, decoded again only for context
        self._read = 0  # ids before this are emitted

    def push(self, ids: Iterable[int]) -> str:
        """The text ``ids`` complete, appended to the stream so far (str; ``""`` while held back).

        Held-back ids that ``ids`` do not complete (the text would go on with U+FFFD, where ``ids`` alone decode
        without one) are dropped and the stream starts again at ``ids``: a character cut in half is never sent,
        and a state kept by a reused request id (the postprocessing model) does not carry one request's bytes
        into the next."""
        new = [int(i) for i in ids]
        held = self._read < len(self._ids)
        self._ids.extend(new)
        if self._read == len(self._ids):
            return ""
        text = self._push()
        if held and text.startswith(REPLACEMENT) and new \
                and not self._batch_decode([new])[0].startswith(REPLACEMENT):
            self._ids, self._prefix, self._read = [], 0, 0
            return self.push(new)
        return text

    def _push(self) -> str:
        window = self._ids[self._prefix:]
        before, text = self._batch_decode([self._ids[self._prefix:self._read], window])
        ends = [len(self._ids)]
        if text.endswith(REPLACEMENT):  # the last character is not whole yet: send what comes before it
            ends = [len(self._ids) - k for k in range(1, min(MAX_CHAR_TOKENS, len(self._ids) - self._read - 1) + 1)]
            texts = self._batch_decode([self._ids[self._prefix:e] for e in ends]) if ends else []
        else:
            texts = [text]
        for end, text in zip(ends, texts):
            if not text.endswith(REPLACEMENT) and len(text) > len(before):
                self._prefix, self._read = self._read, end
                return text[len(before):]
        return ""  # nothing whole (or nothing visible: a skipped special token) yet

    @property
    def pending(self) -> int:
        """How many ids have been pushed but not yet emitted as text."""
        return len(self._ids) - self._read


def decode_stream(batch_decode: Callable[[list[list[int]]], list[str]],
                  chunks: Sequence[Sequence[int]]) -> list[str]:
    """One stream's chunks of token ids -> their texts through one :class:`IncrementalDetokenizer` (list[str], one
    per chunk)."""
    detok = IncrementalDetokenizer(batch_decode)
    return [detok.push(ids) for ids in chunks]


class Utf8Joiner:
    """Byte chunks (each possibly ending inside a character) -> str pieces that never split one: Python's
    incremental UTF-8 decoder, U+FFFD for bytes that are invalid even when complete."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Stop strings matched on the decoded text, wherever they fall across tokens (OpenAI's and vLLM's ``stop``):
    ``push(text)`` returns the text that can be sent, holding back the last ``len(longest stop) - 1`` characters
    (they may begin a stop string); once a stop string appears, the text before it is returned, the stop string and
    all after it are dropped, and ``stopped`` is True. ``flush()`` returns what is held at the end of the stream."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._buf = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        self._buf += text
        hits = [i for i in (self._buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self._buf, self.stopped = self._buf[:min(hits)], "", True
            return out
        cut = max(0, len(self._buf) - self._hold)
        out, self._buf = self._buf[:cut], self._buf[cut:]
        return out

    def flush(self) -> str:
        out, self._buf = ("" if self.stopped else self._buf), ""
        return out
