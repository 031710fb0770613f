"""The portable runtime's log-prob tensors beyond upstream's interface, served by the real tritonserver on the default
build (the session's server, shared with the OpenAI frontend's tests): through the ensemble and tensorrt_llm_bls,
per sequence of num_return_sequences, and refused by name where a value is wrong. The values themselves are checked
against transformers in tests/pipeline/test_openai_frontend.py."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.client import RequestFailed, stream_generate

pytestmark = pytest.mark.e2e

OUTPUTS = ("output_log_probs", "top_log_probs", "top_token_ids", "prompt_log_probs", "prompt_top_log_probs",
           "prompt_top_token_ids")
PROMPT = "The capital of France is"
ASK = {"return_log_probs": True, "num_top_logprobs": 3, "return_prompt_log_probs": True}


def _chunks(server, model="ensemble", extra=ASK, outputs=OUTPUTS, **kw):
    return list(stream_generate(server.cfg.grpc_url, PROMPT, 5, model=model, timeout_s=120, extra=extra,
                                extra_outputs=outputs, **kw))


def _gather(chunks, name):
    return [c.outputs[name] for c in chunks if c.outputs and name in c.outputs]


def test_ensemble_and_bls_carry_the_top_tokens_and_the_prompt_with_the_first_response(default_server, built_default):
    from transformers import AutoTokenizer

    n_prompt = len(AutoTokenizer.from_pretrained(str(built_default / "engine")).encode(PROMPT))
    ens = _chunks(default_server, end_id=49151)  # an id never generated: 5 tokens
    assert sum(c.num_tokens for c in ens) == 5
    prompt = _gather(ens, "prompt_log_probs")
    assert len(prompt) == 1 and prompt[0].shape == (1, n_prompt - 1)  # once, the first token has none
    assert ens[0].outputs and "prompt_log_probs" in ens[0].outputs
    assert _gather(ens, "prompt_top_token_ids")[0].shape == (1, n_prompt - 1, 3)
    top_ids = np.concatenate([a.reshape(-1, 3) for a in _gather(ens, "top_token_ids")])
    top = np.concatenate([a.reshape(-1, 3) for a in _gather(ens, "top_log_probs")])
    sampled = np.concatenate([a.reshape(-1) for a in _gather(ens, "output_log_probs")])
    assert top.shape == (5, 3) and (np.diff(top, axis=1) <= 0).all()  # most likely first
    assert (top[:, 0] == sampled).all()  # greedy: the token generated is the most likely, with its own value
    bls = _chunks(default_server, model="tensorrt_llm_bls", outputs=OUTPUTS + ("output_token_ids",), end_id=49151)
    ids = np.concatenate([a.reshape(-1) for a in _gather(bls, "output_token_ids")])
    assert (ids == top_ids[:, 0]).all() and "".join(c.text for c in bls) == "".join(c.text for c in ens)
    np.testing.assert_array_equal(np.concatenate([a.reshape(-1, 3) for a in _gather(bls, "top_log_probs")]), top)
    np.testing.assert_array_equal(_gather(bls, "prompt_log_probs")[0], prompt[0])
    plain = _chunks(default_server, extra={"return_log_probs": True}, end_id=49151)  # nothing beyond upstream's
    assert not _gather(plain, "top_log_probs") and not _gather(plain, "prompt_log_probs")


def test_every_sequence_gets_the_prompt_and_its_own_top_tokens(default_server):
    chunks = _chunks(default_server, extra={**ASK, "num_return_sequences": 2, "top_k": 20, "temperature": 1.5,
                                            "seed": 11}, outputs=OUTPUTS + ("sequence_index",))
    prompts = {int(c.outputs["sequence_index"].reshape(-1)[0]): c.outputs["prompt_log_probs"] for c in chunks
               if c.outputs and "prompt_log_probs" in c.outputs}
    assert sorted(prompts) == [0, 1] and (prompts[0] == prompts[1]).all()
    for seq in (0, 1):
        rows = [c for c in chunks if c.outputs and int(c.outputs["sequence_index"].reshape(-1)[0]) == seq]
        n = sum(c.num_tokens for c in rows)
        assert sum(c.outputs["top_log_probs"].reshape(-1, 3).shape[0] for c in rows if "top_log_probs" in c.outputs) \
            == n > 0


@pytest.mark.parametrize("extra,says", [
    ({"num_top_logprobs": 21}, "num_top_logprobs = 21: must be between 0 and 20"),
    ({"num_top_logprobs": -2}, "num_top_logprobs = -2: must be between 0 and 20"),
    ({"return_context_logits": True}, "return_context_logits = true: the pytorch runtime does not return the prompt's "
                                      "logits"),
])
def test_bad_values_are_refused_naming_the_input(default_server, extra, says):
    with pytest.raises(RequestFailed, match=says) as err:
        _chunks(default_server, extra=extra)
    if "context" in says:
        assert "return_prompt_log_probs" in str(err.value)  # the input to send instead
    assert sum(c.num_tokens for c in _chunks(default_server, extra={}, outputs=())) > 0  # the server keeps serving
