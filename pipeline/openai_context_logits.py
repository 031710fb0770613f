"""Log probabilities on a runtime without this project's log-prob tensors: TensorRT-LLM's C++ backend (runtime trtllm).

One job: what the OpenAI frontend asks such a runtime for, and the prompt's log probabilities computed here from its
``context_logits``. The C++ backend returns, per generated token, only the sampled token's log probability
(``return_log_probs`` -> ``output_log_probs``), and, from an engine built with ``limits.gather_context_logits``,
every prompt token's logits (``return_context_logits`` -> ``context_logits`` [prompt, vocab]; the backend refuses the
request otherwise): tests/facts/trtllm_1_2_1/log_probs.json. So:

* generated tokens: their log probabilities, no alternatives (chat ``top_logprobs`` > 0 and completions ``logprobs``
  k > 0 without ``echo`` are refused by name: alternatives would need generation logits, which this path does not
  ask for; with ``echo`` the k alternatives are the prompt's, and a generated token's ``top_logprobs`` holds only
  itself, so lm-evaluation-harness's ``echo, logprobs 1, max_tokens 1`` requests, which read the prompt's, work);
* completions ``echo`` with ``logprobs`` (and ``max_tokens: 0`` scoring, as lm-evaluation-harness's loglikelihood
  sends it): the prompt's log probabilities and k alternatives from ``context_logits`` (:func:`prompt_arrays`), in
  the shapes the portable runtime's ``prompt_*`` tensors have, so pipeline.openai_logprobs formats both alike;
  refused with a 400 naming ``limits.gather_context_logits`` when the build lacks it.

The backend returns ``output_log_probs`` only when a sampling parameter is set (the documented caveat in
log_probs.json): a greedy request is sent ``top_k: 1``, which decodes the same way; the repository sets
``normalize_log_probs`` false (model_repo.generate), so that token's value is its log probability over the whole
vocabulary, not 0.0 over a top-k set of one.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from pipeline.openai_errors import APIError

SAMPLED_INPUT = "return_log_probs"
"""The Triton input of upstream's interface that gives the sampled tokens' log probabilities (output_log_probs)."""
SAMPLED_OUTPUTS = ("output_token_ids", "output_log_probs")
"""What a request with log probabilities asks the BLS model for on this path (output_token_ids: the BLS's own)."""
CONTEXT_LOGITS = "context_logits"
"""The C++ backend's prompt logits output ([1, prompt, vocab], FP32 as the repository declares it)."""


def engine_path_request(asked: Any, chat: bool, context_logits: bool) -> Any:
    """``asked`` (pipeline.openai_requests.Prepared, with log probabilities) rewritten for the C++ backend: the
    portable runtime's num_top_logprobs / return_prompt_log_probs dropped, ``return_context_logits`` for an echo,
    ``top_k: 1`` for a greedy request, and ``outputs`` the tensors to ask for. ``context_logits``: the served
    engine was built with limits.gather_context_logits.

    Raises:
        APIError: 400 naming ``top_logprobs`` / ``logprobs`` for alternatives of generated tokens, ``echo`` for
            prompt log probabilities from an engine without context logits.
    """
    k = asked.logprobs
    if chat and k:
        raise APIError(400, f"top_logprobs: {k}: this server's runtime (TensorRT-LLM's C++ backend) returns only the "
                            "sampled token's log probability (output_log_probs); alternatives need generation "
                            "logits: send top_logprobs 0 or leave it out", param="top_logprobs")
    if asked.echo and not context_logits:
        raise APIError(400, "echo: prompt log probabilities (echo with logprobs) need an engine built with context "
                            "logits: set limits.gather_context_logits: true in the build file and rebuild, or leave "
                            "echo or logprobs out", param="echo")
    if not chat and k and not asked.echo:
        raise APIError(400, f"logprobs: {k} alternatives per generated token: this server's runtime (TensorRT-LLM's "
                            "C++ backend) returns only the sampled token's log probability (output_log_probs): send "
                            "logprobs 0" + (", or echo: true to score the prompt (its alternatives come from the "
                                            "context logits)" if context_logits else ""),
                       param="logprobs")
    extra = {key: v for key, v in asked.extra.items() if key not in ("num_top_logprobs", "return_prompt_log_probs")}
    if not {"top_k", "top_p", "temperature"} & set(extra):  # greedy: the same decoding, and output_log_probs come
        extra["top_k"] = 1
    outputs = SAMPLED_OUTPUTS
    if asked.echo:
        extra["return_context_logits"] = True
        outputs += (CONTEXT_LOGITS,)
    return asked._replace(extra=extra, outputs=outputs)


def prompt_arrays(ids: Sequence[int], logits: np.ndarray, k: int) -> dict:
    """The prompt's log probabilities from the engine's ``context_logits``, shaped as the portable runtime's.

    Args:
        ids: the prompt's token ids as the preprocessing model tokenized them, [n].
        logits: ``context_logits`` [..., n, vocab] (float32 or float16; any leading dims of size 1).
        k: alternatives per token (0: none).

    Returns:
        ``prompt_log_probs`` [n - 1] float32: log_softmax (float32) of logits row i at token ids[i + 1] (row i
        scores the token after position i; the first token has none), and with k, ``prompt_top_token_ids`` [n - 1,
        k] int32 / ``prompt_top_log_probs`` [n - 1, k] float32, the k most likely of each row, most likely first.

    Raises:
        ValueError: the rows are not one per prompt token (the frontend and the preprocessing model tokenize
            differently).
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    rows = np.asarray(logits).reshape(-1, logits.shape[-1])
    if rows.shape[0] != len(ids):
        raise ValueError(f"the runtime sent context logits for {rows.shape[0]} prompt tokens, the prompt has "
                         f"{len(ids)}: the frontend and the preprocessing model tokenize differently")
    x = rows[:-1].astype(np.float32)
    peak = x.max(axis=1, keepdims=True)
    lp = x - (peak + np.log(np.exp(x - peak).sum(axis=1, keepdims=True, dtype=np.float32)))
    n = len(ids) - 1
    out = {"prompt_log_probs": lp[np.arange(n), ids[1:]].astype(np.float32)}
    if k:
        k = min(k, lp.shape[1])
        top = np.argpartition(-lp, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(lp, top, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        out["prompt_top_token_ids"] = np.take_along_axis(top, order, axis=1).astype(np.int32)
        out["prompt_top_log_probs"] = np.take_along_axis(vals, order, axis=1).astype(np.float32)
    return out
