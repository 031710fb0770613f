# Prompt log probabilities for the portable `pytorch` runtime (return_prompt_log_probs).
#
# transformers' continuous batching computes logits at the last prompt position only, so a request that asks
# for its prompt's log probabilities gets one plain forward pass of the prompt (the model's own forward, the
# served weights and dtype, outside the paged KV pool) in the process that holds the model: engine_worker.py's
# receiver before the request is added, or model.py's intake with engine_process false. A prompt longer than
# CHUNK_ROWS goes through in chunks over a DynamicCache, so the logits held at once stay CHUNK_ROWS x vocab (a
# 128k-vocabulary model's 8k-token prompt would need 4 GiB of float32 logits in one go); the last prompt token is
# not fed (its logits score nothing). Position i of the logits scores prompt token i + 1, so a prompt
# of n tokens gives n - 1 log probabilities (the first token has none, as OpenAI and vLLM answer null for it),
# each with the num_top_logprobs most likely tokens of the same distribution, most likely first (torch.topk).
# The values are float32 log_softmax of the logits, the same rule as the generated tokens' (sampling.py).
# Pure torch: unit-tested without a server (tests/model_repo/test_log_probs.py).

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

CHUNK_ROWS = 512
"""Prompt positions whose logits are computed at once (one forward of the chunk: rows x vocab floats)."""


@dataclass
class PromptLogProbs:
    """One prompt's log probabilities: ``log_probs[i]`` is that of prompt token i + 1 given the tokens before it;
    ``top_log_probs[i]`` / ``top_ids[i]`` the k most likely tokens there (empty lists when k is 0)."""

    log_probs: list = field(default_factory=list)
    top_log_probs: list = field(default_factory=list)
    top_ids: list = field(default_factory=list)

    def as_tuple(self) -> tuple:
        """Plain lists, for the engine process's pickled step messages."""
        return self.log_probs, self.top_log_probs, self.top_ids


def prompt_log_probs(model, ids, k: int = 0) -> PromptLogProbs:
    """The log probability of each prompt token after the first, from a forward pass of ``model`` (a transformers
    causal LM in eval mode) over ``ids`` (token ids; CHUNK_ROWS positions at a time over a KV cache), with the ``k``
    most likely tokens at each position."""
    import torch

    out = PromptLogProbs()
    if len(ids) < 2:
        return out
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    scored = len(ids) - 1  # positions 0 ... n - 2 score tokens 1 ... n - 1
    chunked = scored > CHUNK_ROWS
    cache, name = None, _cache_kwarg(model)
    with torch.inference_mode():
        for start in range(0, scored, CHUNK_ROWS):
            stop = min(start + CHUNK_ROWS, scored)
            res = model(input_ids=x[:, start:stop], use_cache=chunked, **({name: cache} if cache is not None else {}))
            cache = getattr(res, name, None) if chunked else None
            rows = torch.log_softmax(res.logits[0].float(), dim=-1)
            out.log_probs += rows.gather(1, x[0, start + 1:stop + 1, None])[:, 0].tolist()
            if k:
                values, top = torch.topk(rows, k, dim=-1)
                out.top_log_probs += values.tolist()
                out.top_ids += top.tolist()
            del res, rows
    return out


def _cache_kwarg(model) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers 5.24, which deprecates the other) or
    ``past_key_values`` (5.17); the output names it the same way."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Memo:
    """The last prompt scored, kept for the next call with the same ids and k: the sequences of one request
    (num_return_sequences) arrive one after another and share one forward pass.

    ``manager``: the transformers continuous-batching manager whose generation thread runs the same model. A
    prompt's forward pass never overlaps one of its generation steps: the two share one lock, held around each step
    (the manager's ``_generation_step``, wrapped here) and each scoring. Overlapping them gave wrong prompt log
    probabilities (transformers 5.24, four concurrent echo requests: one in four scored, e.g., -12.64 where the
    model gives -0.54; tests/pipeline/test_lm_eval.py's batched run)."""

    def __init__(self, manager):
        self._key, self._value = None, None
        self.manager = manager
        self.lock = threading.Lock()
        step = manager._generation_step

        def locked_step():
            with self.lock:
                step()

        manager._generation_step = locked_step

    scope = None
    """``scope(task_id)``: a context manager that puts the forward pass on a LoRA adapter (adapters.Lora.only), or
    None without adapters."""

    def get(self, ids, k: int, task_id: int = 0) -> PromptLogProbs:
        key = (tuple(ids), int(k), int(task_id))
        if key != self._key:
            with self.lock, (self.scope(task_id) if self.scope is not None else contextlib.nullcontext()):
                value = prompt_log_probs(self.manager.model, ids, k)
            self._key, self._value = key, value
        return self._value
