# Per-request sampling for the portable `pytorch` runtime, on top of transformers' continuous
# batching (transformers 5.24).
#
# What the library does per request (ContinuousBatchingConfig(per_request_processors=True) and a
# GenerationConfig with non-default temperature/top_k/top_p at creation): temperature, top_k, top_p.
# What it does only globally or not at all, and this module does per request instead:
#   * penalties (repetition, presence, frequency) and min_tokens: `PenaltyProcessor`, first in the
#     processor list, on the request's own token history;
#   * the seed and the draw itself: `SamplerProcessor`, last in the list, draws the token with the
#     request's own torch.Generator (seeded from `random_seed`, or randomly) and leaves only that token
#     finite, so the library's global argmax/multinomial returns exactly it; it also records the token's
#     log probability for return_log_probs.
# Greedy (nothing set, top_k == 1 or temperature == 0) is top_k=1 in the library: one finite token.
#
# Both processors find a request's parameters through one int32 per request (a handle into
# `RequestTable`), the per-request argument slot the library gives each CB processor.
# Requires synchronous batching (use_async_batching=False): a batch's arguments are prepared and
# consumed before the next batch is prepared.
# Pure torch + transformers (no Triton imports), so it is unit-tested without a server.

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

HANDLE_KWARG = "trtpipe_handle"
# The library's warpers exist only if these are non-default when the manager is created; every
# request then passes its own values, so these never apply to a request.
CREATION_DEFAULTS = {"do_sample": True, "temperature": 0.5, "top_k": 1, "top_p": 0.5}


class SamplingError(ValueError):
    """A sampling option the request cannot have (sent back to that request only)."""


@dataclass
class SamplingParams:
    """One request's decoding options, validated (TensorRT-LLM's names and defaults)."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k limit
    top_p: float = 1.0  # 1.0: no nucleus limit
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    end_ids: tuple = ()
    return_log_probs: bool = False

    def library_kwargs(self, vocab_size: int) -> dict:
        """Per-request kwargs for the library's CB warpers (types must be exactly float/int/float)."""
        if self.greedy:
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        return {"temperature": float(self.temperature), "top_k": int(self.top_k or vocab_size),
                "top_p": float(self.top_p)}

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.min_tokens > 0)


def parse_params(get, *, end_ids, max_new_tokens: int) -> SamplingParams:
    """Validate a request's options. ``get(name)`` returns the scalar input or None when absent.

    Sampling is on when temperature > 0, top_k > 1 or 0 < top_p < 1 is sent; greedy otherwise
    (nothing sent, top_k == 1, or temperature == 0).
    """
    p = SamplingParams(end_ids=tuple(end_ids))
    temperature, top_k, top_p = get("temperature"), get("runtime_top_k"), get("runtime_top_p")
    if temperature is not None:
        if not math.isfinite(temperature) or temperature < 0:
            raise SamplingError(f"temperature = {temperature}: must be >= 0 (0 means greedy)")
        p.temperature = float(temperature)
    if top_k is not None:
        if top_k < 0:
            raise SamplingError(f"top_k = {top_k}: must be >= 0 (0 means no limit, 1 means greedy)")
        p.top_k = int(top_k)
    if top_p is not None:
        if not (0.0 <= top_p <= 1.0):
            raise SamplingError(f"top_p = {top_p}: must be in [0, 1] (0 or 1 means no limit)")
        p.top_p = float(top_p) if top_p > 0 else 1.0
    sampling_asked = ((temperature is not None and temperature > 0) or (top_k is not None and top_k > 1)
                      or (top_p is not None and 0 < top_p < 1))
    p.greedy = not sampling_asked or p.top_k == 1 or (temperature is not None and temperature == 0)
    seed = get("random_seed")
    if seed is not None:
        p.seed = int(seed) & 0x7FFF_FFFF_FFFF_FFFF
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = get(name)
        if value is not None:
            if not math.isfinite(value):
                raise SamplingError(f"{name} = {value}: must be a finite number")
            setattr(p, name, float(value))
    if p.repetition_penalty <= 0:
        raise SamplingError(f"repetition_penalty = {p.repetition_penalty}: must be > 0 (1.0 means none)")
    min_tokens = get("min_tokens")
    if min_tokens is not None:
        if min_tokens < 0:
            raise SamplingError(f"min_tokens = {min_tokens}: must be >= 0")
        if min_tokens > max_new_tokens:
            raise SamplingError(f"min_tokens = {min_tokens} exceeds max_tokens = {max_new_tokens}: "
                                "lower min_tokens or raise max_tokens")
        p.min_tokens = int(min_tokens)
    p.return_log_probs = bool(get("return_log_probs") or False)
    return p


@dataclass
class Entry:
    """What the processors know and record about one generated sequence."""

    params: SamplingParams
    generator: torch.Generator
    history: list = field(default_factory=list)  # prompt + generated tokens at the last prepare
    generated: int = 0
    log_probs: list = field(default_factory=list)  # one per generated token, when asked for
    scratch: torch.Tensor | None = None


class RequestTable:
    """handle (int32) -> Entry; shared by the runtime (writer) and the processors (readers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._next = 0

    def add(self, params: SamplingParams) -> int:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(params.seed if params.seed is not None else random.getrandbits(63))
        with self._lock:
            self._next = (self._next + 1) % 0x7FFF_FFFF
            handle = self._next
            self._entries[handle] = Entry(params, gen)
        return handle

    def get(self, handle: int) -> Entry | None:
        return self._entries.get(handle)

    def drop(self, handle: int) -> None:
        with self._lock:
            self._entries.pop(handle, None)

    def __len__(self) -> int:
        return len(self._entries)


class _HandleProcessor(ContinuousBatchingLogitsProcessor):
    """Carries each request's handle in its per-request int32 argument slot."""

    supported_kwargs = {HANDLE_KWARG: int}
    ignored_kwargs = ()

    def __init__(self, table: RequestTable):
        self.table = table

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        handles = []
        for request in requests_with_new_token:
            state = request.state
            handle = int(state.logit_processor_kwargs.get(HANDLE_KWARG, -1))
            entry = self.table.get(handle)
            if entry is not None and self.records_state:
                entry.history = list(state.initial_tokens) + list(state.generated_tokens)
                entry.generated = len(state.generated_tokens)
            handles.append(handle)
        return torch.tensor(handles, dtype=torch.int32, device="cpu")

    records_state = False

    def _rows(self, scores: torch.Tensor, tensor_arg: torch.Tensor):
        for i, handle in enumerate(tensor_arg[: scores.size(0)].tolist()):
            entry = self.table.get(handle)
            if entry is not None:
                yield i, entry


class PenaltyProcessor(_HandleProcessor):
    """First processor: repetition/presence/frequency penalties and min_tokens, per request.

    Repetition penalty (multiplicative, as TensorRT-LLM and HF) counts prompt and generated tokens;
    presence and frequency penalties (additive, OpenAI-style) count generated tokens only; min_tokens
    masks every end id until that many tokens were generated. Also keeps the model's log
    distribution after penalties for return_log_probs.
    """

    records_state = True

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        out = None
        for i, entry in self._rows(scores, tensor_arg):
            p = entry.params
            if p.needs_penalties:
                if out is None:
                    out = scores.clone()
                row = out[i]
                if p.repetition_penalty != 1.0 and entry.history:
                    ids = torch.tensor(sorted(set(entry.history)), dtype=torch.long)
                    vals = row[ids]
                    row[ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
                gen = entry.history[len(entry.history) - entry.generated:] if entry.generated else []
                if gen and (p.presence_penalty or p.frequency_penalty):
                    ids, counts = torch.tensor(gen, dtype=torch.long).unique(return_counts=True)
                    row[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(row.dtype)
                if entry.generated < p.min_tokens and p.end_ids:
                    row[torch.tensor(list(p.end_ids), dtype=torch.long)] = float("-inf")
            if p.return_log_probs:
                src = scores if out is None else out
                entry.scratch = torch.log_softmax(src[i], dim=-1)
        return scores if out is None else out


class SamplerProcessor(_HandleProcessor):
    """Last processor: draws each request's token with its own generator, leaves only it finite."""

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for i, entry in self._rows(scores, tensor_arg):
            row = scores[i]
            if entry.params.greedy:
                token = int(torch.argmax(row))
            else:
                probs = torch.softmax(row, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=entry.generator))
            out[i].fill_(float("-inf"))
            out[i, token] = 0.0
            if entry.params.return_log_probs and entry.scratch is not None:
                entry.log_probs.append(float(entry.scratch[token]))
                entry.scratch = None
        return out


def install(manager, table: RequestTable) -> None:
    """Put the two processors around the library's per-request warpers (before ``manager.start()``)."""
    lp = manager.logit_processor
    lp.logits_processor.insert(0, PenaltyProcessor(table))
    lp.logits_processor.append(SamplerProcessor(table))
    lp.tensors_required += 2
    lp._retrieve_processors_kwargs()
    lp.do_processing = True
