"""Per-request decoding options, validated once for every Python-backend runtime.

The portable runtime (tensorrt_llm_pytorch/1/sampling.py) and the LLM-API runtime
(tensorrt_llm_llmapi/1/request_params.py) read the same optional request inputs (TensorRT-LLM's Triton
names: temperature, runtime_top_k, runtime_top_p, seed, repetition/presence/frequency_penalty, min_tokens,
embedding_bias, return_log_probs; and this project's num_top_logprobs and return_prompt_log_probs, beyond upstream's
interface) and refuse the same values with the same messages; each then maps the result
onto its own engine. The greedy rule is TensorRT-LLM's (``regularizeTopKTopP`` in its sampling kernels: top_k 0
and top_p 0, the defaults, mean greedy; top_k > 0 with top_p 0 means top_p 1), so temperature alone does not
sample, as with the C++ backend and the LLM API; temperature 0 is greedy too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional


class DecodingError(ValueError):
    """A request input this runtime cannot honour (sent back to that request only)."""


@dataclass
class Decoding:
    """One request's validated decoding inputs; None where the request sent none.

    Attributes:
        temperature: >= 0.
        top_k: >= 0 (0: no limit).
        top_p: in [0, 1] (0: unset).
        greedy: the greedy rule's verdict (module docstring).
        seed: as sent (each runtime maps it onto its generator).
        repetition_penalty: > 0 (1.0: none).
        presence_penalty, frequency_penalty: finite.
        min_tokens: 0 ... max_new_tokens (0: none).
        embedding_bias: one float per token id, None when absent, empty or all zeros.
        return_log_probs: the request asked for the sampled tokens' log probabilities.
        num_top_logprobs: 0 ... MAX_TOP_LOGPROBS: the most likely tokens and their log probabilities to return
            per token (0: none).
        return_prompt_log_probs: the request asked for the log probability of each prompt token after the first.
    """

    temperature: Optional[float] = None
    top_k: int = 0
    top_p: Optional[float] = None
    greedy: bool = True
    seed: Optional[int] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    min_tokens: int = 0
    embedding_bias: Optional[list] = None
    return_log_probs: bool = False
    num_top_logprobs: int = 0
    return_prompt_log_probs: bool = False


MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (num_top_logprobs): OpenAI's top_logprobs limit."""


def _finite(name: str, value) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise DecodingError(f"{name} = {value}: must be a finite number")
    return value


def decoding(get: Callable[[str], object], *, max_new_tokens: int, embedding_bias=None,
             vocab_size: Optional[int] = None) -> Decoding:
    """Validate a request's decoding inputs.

    Args:
        get: ``get(name)`` returns the request's scalar input ``name`` (its Triton name) or None when absent.
        max_new_tokens: request_output_len (min_tokens may not exceed it).
        embedding_bias: the embedding_bias input, floats per token id (None or empty: none).
        vocab_size: the model's vocabulary; embedding_bias may be at most this long.

    Raises:
        DecodingError: a value out of range, naming the input, the value and the rule.
    """
    d = Decoding()
    temperature, top_k, top_p = get("temperature"), get("runtime_top_k"), get("runtime_top_p")
    if temperature is not None:
        if _finite("temperature", temperature) < 0:
            raise DecodingError(f"temperature = {temperature}: must be >= 0 (0 means greedy)")
        d.temperature = float(temperature)
    if top_k is not None:
        if int(top_k) < 0:
            raise DecodingError(f"top_k = {top_k}: must be >= 0 (0 means no limit, 1 means greedy)")
        d.top_k = int(top_k)
    if top_p is not None:
        if not 0.0 <= _finite("top_p", top_p) <= 1.0:
            raise DecodingError(f"top_p = {top_p}: must be in [0, 1] (0 means unset)")
        d.top_p = float(top_p)
    sampling_asked = d.top_k > 1 or (d.top_k == 0 and d.top_p is not None and d.top_p > 0)
    d.greedy = not sampling_asked or d.temperature == 0
    seed = get("seed")
    d.seed = None if seed is None else int(seed)
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = get(name)
        if value is not None:
            setattr(d, name, _finite(name, value))
    if d.repetition_penalty is not None and d.repetition_penalty <= 0:
        raise DecodingError(f"repetition_penalty = {d.repetition_penalty}: must be > 0 (1.0 means none)")
    min_tokens = get("min_tokens")
    if min_tokens is not None:
        if int(min_tokens) < 0:
            raise DecodingError(f"min_tokens = {min_tokens}: must be >= 0")
        if int(min_tokens) > max_new_tokens:
            raise DecodingError(f"min_tokens = {min_tokens} exceeds max_tokens = {max_new_tokens}: lower "
                                "min_tokens or raise max_tokens")
        d.min_tokens = int(min_tokens)
    bias = [float(b) for b in (embedding_bias if embedding_bias is not None else [])]
    if vocab_size is not None and len(bias) > vocab_size:
        raise DecodingError(f"embedding_bias has {len(bias)} entries, above the model's vocab_size {vocab_size}: "
                            "send at most one per token id")
    if not all(math.isfinite(b) for b in bias):
        raise DecodingError("embedding_bias holds a value that is not a finite number")
    d.embedding_bias = bias if any(bias) else None
    d.return_log_probs = bool(get("return_log_probs") or False)
    top = get("num_top_logprobs")
    if top is not None:
        if not 0 <= int(top) <= MAX_TOP_LOGPROBS:
            raise DecodingError(f"num_top_logprobs = {top}: must be between 0 and {MAX_TOP_LOGPROBS} (the most likely "
                                f"tokens returned per token, OpenAI's top_logprobs limit): send at most "
                                f"{MAX_TOP_LOGPROBS}, or 0 for none")
        d.num_top_logprobs = int(top)
    d.return_prompt_log_probs = bool(get("return_prompt_log_probs") or False)
    return d


def request_end_ids(end_id, default_end_ids) -> list:
    """The ids a request ends on: the model's (generation_config.json's eos list) when the client sends no
    end_id or one of them (Llama 3 ends turns on several: naming one keeps the others); the client's alone when
    it sends another id (a deliberate choice, e.g. one never generated so that the output runs to max_tokens)."""
    defaults = [int(t) for t in default_end_ids]
    if end_id is None:
        return defaults
    end_id = int(end_id)
    return ([end_id] + [t for t in defaults if t != end_id]) if end_id in defaults else [end_id]
