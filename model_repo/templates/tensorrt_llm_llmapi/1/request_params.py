# Per-request decoding options of the `trtllm-llmapi` runtime, mapped onto TensorRT-LLM 1.2.1's LLM API
# (`tensorrt_llm.SamplingParams`, tensorrt_llm/sampling_params.py). Pure Python: no TensorRT-LLM,
# Triton or numpy import, so tests call it directly (tests/model_repo/test_llmapi_request_params.py).
#
# The request inputs use the TensorRT-LLM backend's names (model_repo.generate.RUNTIME_INPUTS); the
# validation and the greedy rule are every runtime's (trtpipe_runtime.decoding), so a request decodes the
# same way on every runtime. Greedy is SamplingParams(top_k=1); sampling passes temperature, top_k and
# top_p as sent.
#   seed -> seed; repetition/presence/frequency_penalty as they are; min_tokens;
#   log probabilities (tests/facts/trtllm_1_2_1/log_probs.json llm_api): num_top_logprobs k -> logprobs=k (the
#   PyTorch backend returns a dict of the k most likely tokens per generated token), return_log_probs alone ->
#   logprobs=1; the sampled token's log probability is read from that dict (1.2.1 holds it only when it is among
#   the k; 1.4 always adds it: tests/facts/trtllm_1_4/log_probs.json); num_top_logprobs with beam_width > 1 and
#   return_prompt_log_probs are refused, naming the recorded fact and the pytorch runtime that serves them;
#   return_context_logits and return_generation_logits as they are; embedding_bias (a float per token id) ->
#   embedding_bias;
#   beam_width > 1 -> use_beam_search, best_of = beam_width, n = num_return_sequences (default: all beams);
#   num_return_sequences n (sampling) -> n; stop_words_list / bad_words_list -> stop_token_ids /
#   bad_token_ids (one-token words) and stop / bad strings (longer words, decoded with the model's
#   tokenizer; the LLM API encodes them back).
# Anything the runtime cannot honour is a RequestOptionError naming the input, the value and the fix;
# the model sends it to that request only.

from __future__ import annotations

from dataclasses import dataclass, field

from trtpipe_runtime.decoding import DecodingError, decoding
from trtpipe_runtime.grammar import parse_guide


RequestOptionError = DecodingError  # a request input this runtime cannot honour (sent back to that request only)

LOGPROBS_FIELD = "logprobs"
"""The SamplingParams field that asks for log probabilities: an int, the most likely tokens returned per generated
token (tests/facts/trtllm_1_2_1/log_probs.json llm_api.request_mapping)."""


@dataclass
class RequestOptions:
    """One request's options: ``sampling`` are the keyword arguments of ``tensorrt_llm.SamplingParams``."""

    sampling: dict = field(default_factory=dict)
    num_sequences: int = 1  # sequences (and so sequence_index values) in the request's responses
    beam_search: bool = False
    exclude_input: bool = True
    return_log_probs: bool = False
    num_top_logprobs: int = 0  # k alternatives per generated token (top_log_probs / top_token_ids)
    context_logits: bool = False
    generation_logits: bool = False
    embedding_bias: list | None = None  # floats, one per token id (the model makes the torch tensor)
    guided: dict | None = None  # keyword arguments of tensorrt_llm.sampling_params.GuidedDecodingParams


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

    d = decoding(get, max_new_tokens=max_new_tokens, embedding_bias=embedding_bias, vocab_size=vocab_size)
    temperature, k, top_p, greedy = d.temperature, d.top_k, d.top_p, d.greedy

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

    if d.seed is not None:
        kw["seed"] = d.seed
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if getattr(d, name) is not None:
            kw[name] = getattr(d, name)
    if d.min_tokens > 0:
        kw["min_tokens"] = d.min_tokens
    log_probs, top = d.return_log_probs, d.num_top_logprobs
    if top and beam:
        raise RequestOptionError(f"num_top_logprobs = {top} with beam_width = {beam_width}: TensorRT-LLM's PyTorch "
                                 "backend returns only the sampled token's log probability under beam search (1.2.1 "
                                 "raises 'Beam search does not support multiple logprobs'): send num_top_logprobs 0, "
                                 "or beam_width 1")
    if d.return_prompt_log_probs:
        raise RequestOptionError("return_prompt_log_probs = true: not served by the trtllm-llmapi runtime (TensorRT-"
                                 "LLM's prompt_logprobs gives the k most likely tokens at each prompt position, and the "
                                 "prompt's own token only when it is among them, so its log probability is not "
                                 "available): drop it, or serve the build with runtime pytorch, which scores the prompt")
    if top or log_probs:
        kw[LOGPROBS_FIELD] = top or 1
    kw.update(_words("stop", list(stop_words), decode))
    kw.update(_words("bad", list(bad_words), decode))
    flags = {name: bool(get(f"return_{name}") or False) for name in ("context_logits", "generation_logits")}
    kw.update({f"return_{name}": True for name, on in flags.items() if on})
    exclude = get("exclude_input_in_output")
    return RequestOptions(sampling=kw, num_sequences=n, beam_search=beam,
                          exclude_input=exclude_input_default if exclude is None else bool(exclude),
                          return_log_probs=log_probs, num_top_logprobs=top, embedding_bias=d.embedding_bias,
                          guided=guided_params(get), **flags)


GUIDE_TO_LLMAPI = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}
"""The C++ backend's guide types -> the field of the LLM API's GuidedDecodingParams that takes that guide
(tensorrt_llm/sampling_params.py; tests/facts/trtllm_1_2_1/guided_decoding.json)."""


def guided_params(get) -> dict | None:
    """GuidedDecodingParams keyword arguments for the request's guide (None without one): ``json_object=True``
    for ``json``, else the guide text under the field its type maps to.

    Raises:
        RequestOptionError: the guide is invalid (trtpipe_runtime.grammar.parse_guide).
    """
    guide = parse_guide(get("guided_decoding_guide_type"), get("guided_decoding_guide"))
    if guide is None:
        return None
    field_name = GUIDE_TO_LLMAPI[guide.kind]
    return {field_name: True} if guide.kind == "json" else {field_name: guide.text}


def sampled_log_probs(entries, tokens) -> list:
    """The log probability of each generated token, from an LLM API ``CompletionOutput.logprobs`` slice.

    Each entry is a float, or a dict {token id: Logprob (with ``.logprob``) or float}. A dict without the sampled
    token gives ``-inf``: TensorRT-LLM 1.2.1's PyTorch backend keeps only the ``logprobs`` most likely tokens, so a
    sampled token outside them has no value (tests/facts/trtllm_1_2_1/log_probs.json llm_api.torch_sampler; the
    OpenAI frontend sends it as -9999.0). A missing entry (fewer entries than tokens) counts 0.0.
    """
    out = []
    for entry, token in zip(list(entries or []), tokens):
        if isinstance(entry, dict):
            value = entry.get(token, entry.get(int(token)))
            entry = float("-inf") if value is None else getattr(value, "logprob", value)
        out.append(float(entry) if entry is not None else 0.0)
    return out + [0.0] * (len(tokens) - len(out))


def top_log_probs(entries, n: int, k: int) -> tuple[list, list]:
    """The ``k`` most likely tokens at each of ``n`` generated tokens, from a ``CompletionOutput.logprobs`` slice of
    dicts {token id: Logprob(logprob, rank)}: (log probabilities [n][k] float, token ids [n][k] int), most likely
    first (by rank, then log probability), as the portable runtime's top_log_probs / top_token_ids.

    1.2.1 dicts hold exactly the k most likely (rank 1..k); 1.4 dicts also hold the sampled token, with a rank above k
    when it is not among them, which sorts after them and is left out (the facts' llm_api.torch_sampler). A position
    with fewer than k entries, or none, is padded with -inf and token id -1 (the portable runtime's padding).
    """
    vals, ids = [], []
    entries = list(entries or [])
    for i in range(n):
        entry = entries[i] if i < len(entries) else None
        ranked = []
        for token, value in (entry.items() if isinstance(entry, dict) else ()):
            logprob = float(getattr(value, "logprob", value))
            rank = getattr(value, "rank", None)
            ranked.append((rank if rank is not None else 0, -logprob, int(token), logprob))
        ranked.sort()
        best = ranked[:k]  # a 1.4 sampled token outside the k has rank k + 1 or more: sorted after them
        vals.append([r[3] for r in best] + [float("-inf")] * (k - len(best)))
        ids.append([r[2] for r in best] + [-1] * (k - len(best)))
    return vals, ids


# ---- LoRA: a request's lora_task_id -> LoRARequest(name, task id, path) --------------------------------------
# The engine folder holds each adapter of lora.adapters under lora/<name>/ (an HF PEFT folder: adapter_config.json,
# adapter_model.safetensors) and the table lora/adapters.json: [{name, task_id, path relative to the engine folder,
# rank, ...}] (builders/lora.py write_adapters). The request input is the C++ backend's lora_task_id (UINT64 [1]); 0 or absent is
# the base model. TensorRT-LLM's LoRARequest takes (lora_name, lora_int_id, lora_path[, lora_ckpt_source "hf"]) and
# refuses a path that does not exist (tests/facts/trtllm_1_2_1/lora_llmapi.json lora_request).

LORA_TABLE = "lora/adapters.json"
"""The adapter table, relative to the engine folder (gpt_model_path)."""


def lora_table(engine_dir: str) -> dict:
    """``{task_id: (name, absolute path)}`` from the engine folder's adapter table; {} when it has none.

    Raises:
        ValueError: the table exists but is not a list of {name, task_id, path} with task ids >= 1.
    """
    import json
    import os

    path = os.path.join(engine_dir, LORA_TABLE)
    if not os.path.isfile(path):
        return {}
    with open(path) as fh:
        entries = json.load(fh)
    table = {}
    for e in entries:
        task_id = int(e["task_id"])
        if task_id < 1 or task_id in table:
            raise ValueError(f"{path}: task_id {task_id} must be >= 1 and appear once")
        table[task_id] = (str(e["name"]), os.path.normpath(os.path.join(engine_dir, e["path"])))
    return table


def lora_adapter(task_id, table: dict):
    """The ``(name, task id, path)`` of the adapter a request's ``lora_task_id`` names, or None for the base model
    (0 or absent).

    Raises:
        RequestOptionError: a task id no adapter of this model has (the error names the served ones).
    """
    if task_id is None or int(task_id) == 0:
        return None
    task_id = int(task_id)
    if task_id not in table:
        served = ", ".join(f"{t} ({name})" for t, (name, _) in sorted(table.items())) or "none: no adapters built"
        raise RequestOptionError(f"lora_task_id = {task_id}: no such LoRA adapter; this model serves lora_task_id "
                                 f"0 (the base model) and {served}")
    name, path = table[task_id]
    return name, task_id, path
