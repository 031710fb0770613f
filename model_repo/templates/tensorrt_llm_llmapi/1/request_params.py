# Per-request decoding options of the `trtllm-llmapi` runtime, mapped onto TensorRT-LLM 1.2.1's LLM API
# (`tensorrt_llm.SamplingParams`, tensorrt_llm/sampling_params.py). Pure Python: no TensorRT-LLM,
# Triton or numpy import, so tests call it directly (tests/model_repo/test_llmapi_request_params.py).
#
# The request inputs use the TensorRT-LLM backend's names (model_repo.generate.RUNTIME_INPUTS); the
# rules are the portable runtime's (tensorrt_llm_pytorch/1/sampling.py), so a request decodes the
# same way on every runtime:
#   greedy unless top_k > 1, or top_k unset (0) with top_p > 0, is sent (TensorRT-LLM's rule: top_k 0 and
#   top_p 0 mean greedy, so temperature alone does not sample); temperature == 0 is greedy. Greedy is
#   SamplingParams(top_k=1); sampling passes temperature, top_k and top_p as sent.
#   seed -> seed; repetition/presence/frequency_penalty as they are; min_tokens;
#   return_log_probs -> logprobs=1 (the sampled token's log probability); return_context_logits and
#   return_generation_logits as they are; embedding_bias (a float per token id) -> embedding_bias;
#   beam_width > 1 -> use_beam_search, best_of = beam_width, n = num_return_sequences (default: all beams);
#   num_return_sequences n (sampling) -> n; stop_words_list / bad_words_list -> stop_token_ids /
#   bad_token_ids (one-token words) and stop / bad strings (longer words, decoded with the model's
#   tokenizer; the LLM API encodes them back).
# Anything the runtime cannot honour is a RequestOptionError naming the input, the value and the fix;
# the model sends it to that request only.

from __future__ import annotations

import math
from dataclasses import dataclass, field


class RequestOptionError(ValueError):
    """A request input this runtime cannot honour (sent back to that request only)."""


@dataclass
class RequestOptions:
    """One request's options: ``sampling`` are the keyword arguments of ``tensorrt_llm.SamplingParams``."""

    sampling: dict = field(default_factory=dict)
    num_sequences: int = 1  # sequences (and so sequence_index values) in the request's responses
    beam_search: bool = False
    exclude_input: bool = True
    return_log_probs: bool = False
    context_logits: bool = False
    generation_logits: bool = False
    embedding_bias: list | None = None  # floats, one per token id (the model makes the torch tensor)


def _finite(name, value):
    value = float(value)
    if not math.isfinite(value):
        raise RequestOptionError(f"{name} = {value}: must be a finite number")
    return value


def _words(kind: str, words, decode) -> dict:
    """One-token words -> ``<kind>_token_ids``; longer words -> ``<kind>`` strings (needs ``decode``)."""
    single = [w[0] for w in words if len(w) == 1]
    longer = [w for w in words if len(w) > 1]
    out = {}
    if single:
        out[f"{kind}_token_ids"] = single
    if longer:
        if decode is None:
            raise RequestOptionError(f"{kind}_words with several tokens need the model's tokenizer, which this "
                                     f"runtime has not loaded: send one-token {kind} words")
        out[kind] = [decode(w) for w in longer]
    return out


def request_options(get, *, max_new_tokens: int, max_beam_width: int = 1, max_batch_size: int = 1,
                    stop_words=(), bad_words=(), decode=None, exclude_input_default: bool = False,
                    embedding_bias=None, vocab_size: int | None = None) -> RequestOptions:
    """Validate a request's options and map them onto ``SamplingParams`` keyword arguments.

    Args:
        get: ``get(name)`` returns the request's scalar input ``name`` or None when absent.
        max_new_tokens: request_output_len.
        max_beam_width, max_batch_size: the engine's limits (config.pbtxt parameters).
        stop_words, bad_words: token-id lists (stop_words_list / bad_words_list read by the model).
        decode: token ids -> text with the model's tokenizer (for words of several tokens).
        exclude_input_default: the model's exclude_input_in_output parameter.
        embedding_bias: the embedding_bias input (floats per token id; empty or all zeros: none), at most
            ``vocab_size`` long.

    Raises:
        RequestOptionError: a value out of range or a combination the runtime cannot serve.
    """
    if max_new_tokens < 1:
        raise RequestOptionError(f"request_output_len (max_tokens) = {max_new_tokens}: must be at least 1")
    kw: dict = {"max_tokens": int(max_new_tokens)}
    end_id, pad_id = get("end_id"), get("pad_id")
    if end_id is not None:
        kw["end_id"] = int(end_id)
    if pad_id is not None or end_id is not None:
        kw["pad_id"] = int(pad_id if pad_id is not None else end_id)

    temperature, top_k, top_p = get("temperature"), get("runtime_top_k"), get("runtime_top_p")
    if temperature is not None and (_finite("temperature", temperature) < 0):
        raise RequestOptionError(f"temperature = {temperature}: must be >= 0 (0 means greedy)")
    if top_k is not None and int(top_k) < 0:
        raise RequestOptionError(f"top_k = {top_k}: must be >= 0 (0 means no limit, 1 means greedy)")
    if top_p is not None and not (0.0 <= _finite("top_p", top_p) <= 1.0):
        raise RequestOptionError(f"top_p = {top_p}: must be in [0, 1] (0 means unset)")
    k = int(top_k) if top_k is not None else 0
    sampling_asked = k > 1 or (k == 0 and top_p is not None and top_p > 0)
    greedy = not sampling_asked or (temperature is not None and temperature == 0)

    beam_width = int(get("beam_width") or 1)
    if beam_width < 1 or beam_width > max_beam_width:
        raise RequestOptionError(f"beam_width = {beam_width}: must be between 1 and the engine's max_beam_width "
                                 f"{max_beam_width} (raise limits.max_beam_width in the build file and rebuild "
                                 "for beam search)")
    n = get("num_return_sequences")
    beam = beam_width > 1
    if beam:
        n = beam_width if n is None else int(n)
        if not 1 <= n <= beam_width:
            raise RequestOptionError(f"num_return_sequences = {n} with beam_width = {beam_width}: must be between 1 "
                                     "and beam_width")
        kw.update(use_beam_search=True, best_of=beam_width, n=n)
    else:
        n = 1 if n is None else int(n)
        if not 1 <= n <= max_batch_size:
            raise RequestOptionError(f"num_return_sequences = {n}: must be between 1 and max_batch_size "
                                     f"{max_batch_size}")
        if n > 1 and greedy:
            raise RequestOptionError(f"num_return_sequences = {n} with greedy decoding gives {n} identical answers: "
                                     "also send top_k > 1 or top_p > 0 (or beam_width > 1)")
        if n > 1:
            kw["n"] = n

    if not beam:
        if greedy:
            kw["top_k"] = 1
        else:
            if temperature is not None:
                kw["temperature"] = float(temperature)
            if k > 0:
                kw["top_k"] = k
            kw["top_p"] = float(top_p) if top_p is not None and top_p > 0 else 1.0
    elif temperature is not None and temperature > 0:
        kw["temperature"] = float(temperature)

    seed = get("seed")
    if seed is not None:
        kw["seed"] = int(seed)
    rep = get("repetition_penalty")
    if rep is not None:
        if _finite("repetition_penalty", rep) <= 0:
            raise RequestOptionError(f"repetition_penalty = {rep}: must be > 0 (1.0 means none)")
        kw["repetition_penalty"] = float(rep)
    for name in ("presence_penalty", "frequency_penalty"):
        value = get(name)
        if value is not None:
            kw[name] = _finite(name, value)
    min_tokens = get("min_tokens")
    if min_tokens is not None:
        if int(min_tokens) < 0:
            raise RequestOptionError(f"min_tokens = {min_tokens}: must be >= 0")
        if int(min_tokens) > max_new_tokens:
            raise RequestOptionError(f"min_tokens = {min_tokens} exceeds max_tokens = {max_new_tokens}: lower "
                                     "min_tokens or raise max_tokens")
        if int(min_tokens) > 0:
            kw["min_tokens"] = int(min_tokens)
    log_probs = bool(get("return_log_probs") or False)
    if log_probs:
        kw["logprobs"] = 1
    kw.update(_words("stop", list(stop_words), decode))
    kw.update(_words("bad", list(bad_words), decode))
    flags = {name: bool(get(f"return_{name}") or False) for name in ("context_logits", "generation_logits")}
    kw.update({f"return_{name}": True for name, on in flags.items() if on})
    bias = [float(b) for b in (embedding_bias if embedding_bias is not None else [])]
    if vocab_size is not None and len(bias) > vocab_size:
        raise RequestOptionError(f"embedding_bias has {len(bias)} entries, above the model's vocab_size "
                                 f"{vocab_size}: send at most one per token id")
    if not all(math.isfinite(b) for b in bias):
        raise RequestOptionError("embedding_bias holds a value that is not a finite number")
    exclude = get("exclude_input_in_output")
    return RequestOptions(sampling=kw, num_sequences=n, beam_search=beam,
                          exclude_input=exclude_input_default if exclude is None else bool(exclude),
                          return_log_probs=log_probs, embedding_bias=bias if any(bias) else None, **flags)


def sampled_log_probs(entries, tokens) -> list:
    """The log probability of each generated token, from an LLM API ``CompletionOutput.logprobs`` slice.

    Each entry is a float, or a dict {token id: Logprob (with ``.logprob``) or float} holding the
    sampled token; a missing one counts 0.0.
    """
    out = []
    for entry, token in zip(list(entries or []), tokens):
        if isinstance(entry, dict):
            value = entry.get(token, entry.get(int(token)))
            entry = getattr(value, "logprob", value)
        out.append(float(entry) if entry is not None else 0.0)
    return out + [0.0] * (len(tokens) - len(out))
