# Per-request sampling for the portable `pytorch` runtime, on top of transformers' continuous
# batching (tested with transformers 5.17 and 5.24).
#
# The library is created greedy (do_sample=False, no warpers: its step ends in one argmax) and two
# processors of ours, installed around its (empty) per-request processor list, do everything a
# request can ask for:
#   * `PenaltyProcessor` (first): keeps the raw logits for return_generation_logits, then embedding bias,
#     bad words (transformers' NoBadWordsLogitsProcessor on the request's row), repetition, presence and
#     frequency penalties and min_tokens, on the request's own token history; keeps the log distribution
#     for return_log_probs and num_top_logprobs;
#   * `SamplerProcessor` (last): for a sampled request, temperature, top_k and top_p on its row, then
#     the draw with the request's own torch.Generator (seeded from `seed`, or randomly); it
#     leaves only the drawn token finite, so the library's argmax returns exactly it. It also records
#     the token's log probability for return_log_probs and the num_top_logprobs most likely tokens
#     (torch.topk of the same log distribution: most likely first).
# A greedy request without penalties or log probs is not touched by either: a batch of them costs
# two Python loops over the batch at prepare time and nothing on the logits. (The library's own
# per-request warpers sort the whole vocabulary for every row at every step, twice (top_k, top_p),
# whatever the request asked for: the largest cost of the generation loop on CPU.)
#
# Both processors find a request's parameters through one int32 per request (a handle into
# `RequestTable`), the per-request argument slot the library gives each CB processor.
# Requires synchronous batching (use_async_batching=False): a batch's arguments are prepared and
# consumed before the next batch is prepared.
# Pure torch + transformers (no Triton imports), so it is unit-tested without a server.

from __future__ import annotations

import random
import threading
from abc import abstractmethod
from dataclasses import dataclass, field

import torch
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

from trtpipe_runtime.decoding import DecodingError, decoding, request_end_ids  # noqa: F401 (request_end_ids: model.py)

HANDLE_KWARG = "trtpipe_handle"
# The library's warpers exist only if these are non-default when the manager is created; every
# request then passes its own values, so these never apply to a request.
CREATION_DEFAULTS = {"do_sample": False}  # the library argmaxes; SamplerProcessor draws sampled rows


SamplingError = DecodingError  # a decoding option the request cannot have (sent back to that request only)


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
    return_generation_logits: bool = False
    num_top_logprobs: int = 0  # the most likely tokens (and their log probs) to record per generated token
    return_prompt_log_probs: bool = False  # the prompt's log probs (log_probs.py: one forward pass)
    bad_words: tuple = ()  # token-id sequences never to generate (bad_words_list)
    embedding_bias: dict = field(default_factory=dict)  # token id -> added to its logit every step
    guide_type: str = ""  # guided decoding (trtpipe_runtime.grammar.GUIDE_TYPES); "" for none
    guide: str = ""  # the schema, regex or grammar of guide_type
    lora_task_id: int = 0  # the LoRA adapter (lora_task_id, adapters.py); 0: the base model

    @property
    def needs_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.min_tokens > 0 or bool(self.bad_words) or bool(self.embedding_bias))

    @property
    def wants_log_dist(self) -> bool:
        """The processors keep the row's log distribution: for return_log_probs or num_top_logprobs."""
        return self.return_log_probs or self.num_top_logprobs > 0

    @property
    def needs_history(self) -> bool:
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty or self.frequency_penalty
                                                      or self.bad_words)


def parse_params(get, *, end_ids, max_new_tokens: int, bad_words=(), embedding_bias=None,
                 vocab_size: int | None = None, guide=None) -> SamplingParams:
    """A request's options as this runtime's SamplingParams. ``get(name)`` returns the scalar input or None when
    absent; ``bad_words`` are token-id lists (bad_words_list); ``embedding_bias`` is the embedding_bias input
    (float per token id), at most ``vocab_size`` long; ``guide`` a validated trtpipe_runtime.grammar.Guide or
    None. The validation and the greedy rule are every runtime's
    (trtpipe_runtime.decoding); the seed is folded into torch.Generator's non-negative 63-bit range.

    Raises:
        SamplingError: an option out of range (trtpipe_runtime.decoding.DecodingError).
    """
    d = decoding(get, max_new_tokens=max_new_tokens, embedding_bias=embedding_bias, vocab_size=vocab_size)
    p = SamplingParams(greedy=d.greedy, top_k=d.top_k, min_tokens=d.min_tokens, end_ids=tuple(end_ids),
                       return_log_probs=d.return_log_probs)
    p.bad_words = tuple(tuple(int(t) for t in w) for w in bad_words if len(w))
    p.embedding_bias = {i: b for i, b in enumerate(d.embedding_bias or ()) if b}
    if d.temperature is not None:
        p.temperature = d.temperature
    if d.top_p is not None:
        p.top_p = d.top_p if d.top_p > 0 else 1.0
    if d.seed is not None:
        p.seed = d.seed & 0x7FFF_FFFF_FFFF_FFFF
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if getattr(d, name) is not None:
            setattr(p, name, getattr(d, name))
    p.return_generation_logits = bool(get("return_generation_logits") or False)
    p.num_top_logprobs, p.return_prompt_log_probs = d.num_top_logprobs, d.return_prompt_log_probs
    if guide is not None:
        p.guide_type, p.guide = guide.kind, guide.text
    return p


@dataclass
class Entry:
    """What the processors know and record about one generated sequence."""

    params: SamplingParams
    seed: int
    generators: dict = field(default_factory=dict)  # torch.device -> torch.Generator (made on first draw)
    history: list = field(default_factory=list)  # prompt + generated tokens at the last prepare (penalties)
    generated: int = 0
    log_probs: list = field(default_factory=list)  # one per generated token, when asked for
    logits: list = field(default_factory=list)  # raw logits (float32 numpy [vocab]) per generated token, when asked for
    top: list = field(default_factory=list)  # ([log prob] * k, [token id] * k) per token, for num_top_logprobs
    prompt: object = None  # the prompt's log probs (log_probs.PromptLogProbs), for return_prompt_log_probs
    bad_words: object = None  # transformers' NoBadWordsLogitsProcessor for params.bad_words (made on first use)
    matcher: object = None  # trtpipe_runtime.grammar.Matcher for a guided request (made on first use)
    scratch: torch.Tensor | None = None

    def generator(self, device: torch.device) -> torch.Generator:
        """The request's own generator on the logits' device (a CPU generator cannot draw from CUDA
        tensors), seeded once from the request's seed."""
        gen = self.generators.get(device)
        if gen is None:
            gen = self.generators[device] = torch.Generator(device=device)
            gen.manual_seed(self.seed)
        return gen


class RequestTable:
    """handle (int32) -> Entry; shared by the runtime (writer) and the processors (readers)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[int, Entry] = {}
        self._next = 0
        self.prompts = None  # log_probs.Memo: the prompt scorer beside the manager's steps (engine_worker.py)

    def add(self, params: SamplingParams) -> int:
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        with self._lock:
            self._next = (self._next + 1) % 0x7FFF_FFFF
            handle = self._next
            self._entries[handle] = Entry(params, seed)
        return handle

    def get(self, handle: int) -> Entry | None:
        return self._entries.get(handle)

    def drop(self, handle: int) -> None:
        with self._lock:
            self._entries.pop(handle, None)

    def __len__(self) -> int:
        return len(self._entries)


class _HandleProcessor(ContinuousBatchingLogitsProcessor):
    """Carries each request's handle in its per-request int32 argument slot.

    ``prepare_tensor_args`` also keeps, for the batch being prepared, the rows this processor must
    touch (``_wants``); ``__call__`` uses that list instead of reading the handles back from the
    (device) argument tensor, so a batch of plain greedy requests costs no per-row work, no GPU sync
    and no copy of the logits. Valid because batching is synchronous (see the top of this file): the
    library prepares a batch's arguments and runs its processors before preparing the next batch.
    """

    supported_kwargs = {HANDLE_KWARG: int}
    ignored_kwargs = ()

    def __init__(self, table: RequestTable):
        self.table = table
        self._batch: list[tuple[int, Entry]] = []

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    @abstractmethod
    def _wants(self, params: SamplingParams) -> bool:
        """True for the requests whose rows this processor changes (the others it leaves untouched)."""

    def _record(self, entry: Entry, state) -> None:
        """Copy what the processor needs from the library's request state (at prepare time)."""

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        handles, rows = [], []
        for i, request in enumerate(requests_with_new_token):
            state = request.state
            handle = int(state.logit_processor_kwargs.get(HANDLE_KWARG, -1))
            entry = self.table.get(handle)
            if entry is not None and self._wants(entry.params):
                self._record(entry, state)
                rows.append((i, entry))
            handles.append(handle)
        self._batch = rows
        return torch.tensor(handles, dtype=torch.int32, device="cpu")

    def _rows(self, scores: torch.Tensor):
        n = scores.size(0)
        return [(i, entry) for i, entry in self._batch if i < n]


class GrammarProcessor(_HandleProcessor):
    """First processor: for a guided request (guide_type set), every token its grammar does not allow next
    gets -inf, before penalties and sampling (TensorRT-LLM applies the guided-decoding mask before its
    sampling layers too). The request's matcher is fed the tokens generated since the last step at prepare
    time; its grammar is compiled once per (type, guide) by trtpipe_runtime.grammar.Grammars."""

    def __init__(self, table: RequestTable, grammars):
        super().__init__(table)
        self.grammars = grammars

    def _wants(self, params: SamplingParams) -> bool:
        return bool(params.guide_type)

    def _record(self, entry: Entry, state) -> None:
        if entry.matcher is None:
            from trtpipe_runtime.grammar import Guide

            entry.matcher = self.grammars.matcher(Guide(entry.params.guide_type, entry.params.guide),
                                                  entry.params.end_ids)
        entry.matcher.advance(state.generated_tokens)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = self._rows(scores)
        if not rows:
            return scores
        out = scores.clone()
        for i, entry in rows:
            entry.matcher.mask_(out[i])
        return out


class PenaltyProcessor(_HandleProcessor):
    """First processor: what changes a request's logits before sampling, per request.

    In order: the raw logits are kept for return_generation_logits; the embedding bias is added; bad
    words are banned (transformers' NoBadWordsLogitsProcessor: a word's last token is banned when the
    sequence ends with the rest of it); repetition penalty (multiplicative, as TensorRT-LLM and HF)
    counts prompt and generated tokens; presence and frequency penalties (additive, OpenAI-style) count
    generated tokens only; min_tokens masks every end id until that many tokens were generated. Also
    keeps the model's log distribution after these for return_log_probs.
    """

    def _wants(self, params: SamplingParams) -> bool:
        return params.needs_penalties or params.wants_log_dist or params.return_generation_logits

    def _record(self, entry: Entry, state) -> None:
        entry.generated = len(state.generated_tokens)
        if entry.params.needs_history:
            entry.history = list(state.initial_tokens) + list(state.generated_tokens)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        out = None
        for i, entry in self._rows(scores):
            p = entry.params
            if p.return_generation_logits:
                entry.logits.append(scores[i].detach().float().cpu().numpy().copy())
            if p.needs_penalties:
                if out is None:
                    out = scores.clone()
                row = out[i]
                if p.embedding_bias:
                    ids = torch.tensor(list(p.embedding_bias), dtype=torch.long, device=row.device)
                    row[ids] += torch.tensor(list(p.embedding_bias.values()), dtype=row.dtype, device=row.device)
                if p.bad_words:
                    out[i] = _ban_words(entry, row)
                    row = out[i]
                if p.repetition_penalty != 1.0 and entry.history:
                    ids = torch.tensor(sorted(set(entry.history)), dtype=torch.long, device=row.device)
                    vals = row[ids]
                    row[ids] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
                gen = entry.history[len(entry.history) - entry.generated:] if entry.generated else []
                if gen and (p.presence_penalty or p.frequency_penalty):
                    ids, counts = torch.tensor(gen, dtype=torch.long, device=row.device).unique(return_counts=True)
                    row[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(row.dtype)
                if entry.generated < p.min_tokens and p.end_ids:
                    row[torch.tensor(list(p.end_ids), dtype=torch.long, device=row.device)] = float("-inf")
            if p.wants_log_dist:
                src = scores if out is None else out
                entry.scratch = torch.log_softmax(src[i].float(), dim=-1)
        return scores if out is None else out


def _ban_words(entry: Entry, row: torch.Tensor) -> torch.Tensor:
    """``row`` with the request's bad words banned, by transformers' NoBadWordsLogitsProcessor over its history."""
    from transformers.generation.logits_process import NoBadWordsLogitsProcessor

    if entry.bad_words is None:
        # eos_token_id=None: an end id may be a bad word too (TensorRT-LLM bans what it is given)
        entry.bad_words = NoBadWordsLogitsProcessor([list(w) for w in entry.params.bad_words], eos_token_id=None)
    history = torch.tensor([entry.history], dtype=torch.long, device=row.device)  # prompt + generated: never empty
    return entry.bad_words(history, row.unsqueeze(0)).squeeze(0)


class SamplerProcessor(_HandleProcessor):
    """Last processor: draws each sampled request's token with its own generator and leaves only that
    token finite. Greedy rows without log probs are left to the library (top_k = 1 leaves one
    finite token there), so an all-greedy batch passes through untouched."""

    def _wants(self, params: SamplingParams) -> bool:
        return not params.greedy or params.wants_log_dist

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = self._rows(scores)
        if not rows:
            return scores
        out = scores.clone()
        for i, entry in rows:
            p = entry.params
            if p.greedy:
                token = torch.argmax(scores[i]).view(1)
            else:
                logits = warp(scores[i].float(), p)
                token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=entry.generator(logits.device))
            out[i].fill_(float("-inf"))
            out[i].index_fill_(0, token, 0.0)
            if entry.scratch is not None:
                if p.return_log_probs:
                    entry.log_probs.append(float(entry.scratch[token]))
                if p.num_top_logprobs:
                    values, ids = torch.topk(entry.scratch, p.num_top_logprobs)
                    entry.top.append((values.tolist(), ids.tolist()))
                entry.scratch = None
        return out


def warp(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row of logits ([vocab] float), as HF's
    TemperatureLogitsWarper / TopKLogitsWarper / TopPLogitsWarper and TensorRT-LLM's sampling layer
    order them; filtered entries become -inf. top_k = 0 and top_p = 1 mean no limit.
    Nucleus: keep the smallest set of most likely tokens whose probability sums to >= top_p
    (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"); the most likely token is
    always kept."""
    if p.temperature > 0 and p.temperature != 1.0:
        logits = logits / p.temperature
    vocab = logits.size(-1)
    if 0 < p.top_k < vocab:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0 < p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the more likely tokens
        drop = before >= p.top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def install(manager, table: RequestTable, grammars=None) -> None:
    """Put the processors around the library's per-request warpers (before ``manager.start()``): the grammar
    mask (when ``grammars``, a trtpipe_runtime.grammar.Grammars, is given) and the penalties first, the sampler
    last."""
    lp = manager.logit_processor
    lp.logits_processor.insert(0, PenaltyProcessor(table))
    lp.logits_processor.append(SamplerProcessor(table))
    lp.tensors_required += 2
    if grammars is not None:
        lp.logits_processor.insert(0, GrammarProcessor(table, grammars))
        lp.tensors_required += 1
    lp._retrieve_processors_kwargs()
    lp.do_processing = True
