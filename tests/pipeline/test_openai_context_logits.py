"""The OpenAI frontend's log probabilities on the engine path (runtime trtllm: TensorRT-LLM's C++ backend behind the
BLS), without a server: a test double stands in for the C++ backend (it cannot run here), answering with the
context_logits that SmolLM2-135M-Instruct's real weights give in transformers, and with the sampled tokens' log
probabilities only, as the backend does (tests/facts/trtllm_1_2_1/log_probs.json). The echoed prompt's log
probabilities must be transformers' own log_softmax, in the shapes the portable runtime's answer has."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pipeline.openai_context_logits import prompt_arrays
from pipeline.openai_logprobs import TokenLogprobs
from pipeline.openai_requests import FrontendConfig
from pipeline.openai_triton import LOG_PROB_OUTPUTS, Delta
from tests.templates import template_module

MODEL = "m"
PROMPT = "The capital of France is Paris, and the capital of Italy is"
CPP_BACKEND_INPUTS = ("text_input", "max_tokens", "top_k", "top_p", "temperature", "return_log_probs",
                      "return_context_logits", "return_generation_logits")
"""What the C++ backend's BLS declares (upstream's interface: model_repo.generate.RUNTIME_INPUTS, no num_top_logprobs)."""


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tests.conftest import smollm2_tokenizer_dir

    return smollm2_tokenizer_dir()


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@pytest.fixture(scope="module")
def model(tokenizer_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tokenizer_dir), dtype=torch.float32).eval()


def _logits(model, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].float().numpy()


class CppBackendTriton:
    """The C++ backend's repository behind tensorrt_llm_bls: upstream's inputs only; answers two generated tokens with
    their sampled log probabilities (no alternatives) and, when asked for context_logits, the prompt's logits
    [1, n, vocab] float32 from the model's forward (what an engine built with --gather_context_logits returns)."""

    def __init__(self, model, tok, inputs=CPP_BACKEND_INPUTS):
        self.model, self.tok, self._inputs, self.asked = model, tok, set(inputs), []

    async def ready(self):
        return True

    async def inputs(self):
        return self._inputs

    async def generate(self, prompt, max_tokens, stop, extra, logprobs=()):
        self.asked.append((max_tokens, dict(extra), tuple(logprobs)))
        ids = self.tok.encode(prompt, add_special_tokens=True)  # as the preprocessing model tokenizes
        a, b = self.tok.encode(" Rome.", add_special_tokens=False)[:2]
        prompt_arrays = {"context_logits": _logits(self.model, ids)[None]} if "context_logits" in logprobs else None
        yield Delta(0, self.tok.decode([a]), 1, TokenLogprobs.of([a], [-0.5]), prompt_arrays)
        yield Delta(0, self.tok.decode([b]), 1, TokenLogprobs.of([b], [-1.25]))


class PortableTriton(CppBackendTriton):
    """The portable runtime's repository: its own prompt_* tensors, computed by its own code
    (templates/tensorrt_llm_pytorch/1/log_probs.py) from the same model."""

    def __init__(self, model, tok):
        super().__init__(model, tok, inputs=CPP_BACKEND_INPUTS + ("num_top_logprobs", "return_prompt_log_probs"))

    async def generate(self, prompt, max_tokens, stop, extra, logprobs=()):
        self.asked.append((max_tokens, dict(extra), tuple(logprobs)))
        ids = self.tok.encode(prompt, add_special_tokens=True)
        got = template_module("tensorrt_llm_pytorch", "log_probs").prompt_log_probs(
            self.model, ids, extra.get("num_top_logprobs", 0))
        n = len(ids) - 1
        arrays = {"prompt_log_probs": np.array(got.log_probs, np.float32).reshape(1, n)}
        if got.top_ids:
            arrays["prompt_top_log_probs"] = np.array(got.top_log_probs, np.float32)[None]
            arrays["prompt_top_token_ids"] = np.array(got.top_ids, np.int32)[None]
        a, b = self.tok.encode(" Rome.", add_special_tokens=False)[:2]
        yield Delta(0, self.tok.decode([a]), 1, TokenLogprobs.of([a], [-0.5], [[a]] if got.top_ids else None,
                                                                 [[-0.5]] if got.top_ids else None), arrays)
        yield Delta(0, self.tok.decode([b]), 1, TokenLogprobs.of([b], [-1.25]))


def _post(tokenizer_dir, triton, path, body, context_logits=True):
    from pipeline.openai_frontend import create_app
    from tests.pipeline.test_openai_inflight import _call

    cfg = FrontendConfig("127.0.0.1:1", MODEL, tokenizer_dir, 256, 512, add_special_tokens=True,
                         context_logits=context_logits)
    status, raw = asyncio.run(_call(create_app(cfg, triton=triton), path, body))
    return status, raw


def _reference(model, tok, prompt, k):
    """transformers' own log_softmax (float64) of the forward: each prompt token after the first, and the k most
    likely tokens at each position, as strings."""
    import torch

    ids = tok.encode(prompt, add_special_tokens=True)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    values = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
    tops = [{tok.decode([int(t)]): float(lp[i, t]) for t in torch.topk(lp[i], k).indices} for i in range(len(ids) - 1)]
    return ids, values, tops


def test_loglikelihood_scoring_equals_transformers_log_softmax(model, tok, tokenizer_dir):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 0. The C++ backend is asked for
    context_logits (and the portable runtime's inputs are not sent); the answer's token_logprobs are transformers'
    log_softmax within 1e-4, the first token null, and each top_logprobs holds the most likely token and the
    token itself."""
    triton = CppBackendTriton(model, tok)
    status, raw = _post(tokenizer_dir, triton, "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0})
    assert status == 200, raw
    max_tokens, extra, outputs = triton.asked[0]
    assert outputs == ("output_token_ids", "output_log_probs", "context_logits")
    assert extra["return_context_logits"] is True and extra["return_log_probs"] is True
    assert "num_top_logprobs" not in extra and "return_prompt_log_probs" not in extra
    assert extra["top_k"] == 1  # greedy: the backend returns output_log_probs only with a sampling parameter
    choice = json.loads(raw)["choices"][0]
    ids, want, tops = _reference(model, tok, PROMPT, 1)
    lp = choice["logprobs"]
    assert choice["text"] == PROMPT and lp["tokens"] == [tok.decode([i]) for i in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    np.testing.assert_allclose(lp["token_logprobs"][1:], want, atol=1e-4)
    for got, top, token, value in zip(lp["top_logprobs"][1:], tops, lp["tokens"][1:], want):
        assert set(got) == set(top) | {token}
        for t, v in top.items():
            assert got[t] == pytest.approx(v, abs=1e-4)
        assert got[token] == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize("stream", [False, True])
def test_the_answer_has_the_portable_runtimes_shape_and_values(model, tok, tokenizer_dir, stream):
    """The same request against the portable runtime's repository (its own prompt tensors, its own code) and the
    C++ backend's (context logits, computed by the frontend): the same tokens, offsets and top-3 tokens, values
    within 1e-4; the generated tokens have only their own log probability on the engine path."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 3, "stream": stream}
    answers = []
    for triton in (PortableTriton(model, tok), CppBackendTriton(model, tok)):
        status, raw = _post(tokenizer_dir, triton, "/v1/completions", body)
        assert status == 200, raw
        if stream:
            chunks = [json.loads(e[len("data: "):]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
            answers.append(chunks[0]["choices"][0]["logprobs"])  # the echo chunk
        else:
            answers.append(json.loads(raw)["choices"][0]["logprobs"])
    portable, engine = answers
    assert set(portable) == set(engine) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert portable["tokens"] == engine["tokens"] and portable["text_offset"] == engine["text_offset"]
    assert engine["token_logprobs"][0] is None and engine["top_logprobs"][0] is None
    np.testing.assert_allclose(engine["token_logprobs"][1:], portable["token_logprobs"][1:], atol=1e-4)
    for p, e in zip(portable["top_logprobs"][1:], engine["top_logprobs"][1:]):
        assert set(p) == set(e) and 2 <= len(e) <= 4
        assert all(e[t] == pytest.approx(p[t], abs=1e-4) for t in p)


def test_lm_evals_echo_with_one_generated_token_gets_the_prompts_alternatives(model, tok, tokenizer_dir):
    """lm-evaluation-harness's local-completions sends echo, logprobs 1, max_tokens 1 and reads the prompt's
    entries: they carry their alternatives; the generated token's top_logprobs holds only itself."""
    triton = CppBackendTriton(model, tok)
    status, raw = _post(tokenizer_dir, triton, "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0})
    assert status == 200, raw
    lp = json.loads(raw)["choices"][0]["logprobs"]
    ids, want, tops = _reference(model, tok, PROMPT, 1)
    n = len(ids)
    np.testing.assert_allclose(lp["token_logprobs"][1:n], want, atol=1e-4)
    assert all(set(got) == set(top) | {token} for got, top, token in zip(lp["top_logprobs"][1:n], tops,
                                                                          lp["tokens"][1:n]))
    assert lp["top_logprobs"][n:] == [{lp["tokens"][n]: -0.5}, {lp["tokens"][n + 1]: -1.25}]


def test_echo_with_generated_tokens_and_chat_get_the_sampled_log_probabilities(model, tok, tokenizer_dir):
    triton = CppBackendTriton(model, tok)
    status, raw = _post(tokenizer_dir, triton, "/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 2, "echo": True, "logprobs": 0, "temperature": 0.7})
    lp = json.loads(raw)["choices"][0]["logprobs"]
    n = len(tok.encode(PROMPT))
    assert status == 200 and len(lp["tokens"]) == n + 2 and lp["token_logprobs"][n:] == [-0.5, -1.25]
    assert lp["top_logprobs"][n:] == [{lp["tokens"][n]: -0.5}, {lp["tokens"][n + 1]: -1.25}]
    assert "top_k" not in triton.asked[0][1] and triton.asked[0][1]["top_p"] == 1.0  # sampling already sets one
    chat = CppBackendTriton(model, tok)
    status, raw = _post(tokenizer_dir, chat, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": True},
        context_logits=False)  # the sampled tokens' log probabilities need no build flag
    content = json.loads(raw)["choices"][0]["logprobs"]["content"]
    assert status == 200 and [c["logprob"] for c in content] == [-0.5, -1.25]
    assert all(c["top_logprobs"] == [] for c in content)
    assert chat.asked[0][2] == ("output_token_ids", "output_log_probs")
    assert "return_context_logits" not in chat.asked[0][1]


@pytest.mark.parametrize("path,body,context_logits,param,says", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2},
     True, "top_logprobs", "only the sampled token's log probability"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 2}, True, "logprobs",
     "or echo: true to score the prompt"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "logprobs": 2}, False, "logprobs",
     "alternatives per generated token"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1}, False, "echo",
     "limits.gather_context_logits: true"),
])
def test_what_the_engine_path_cannot_answer_is_a_400_naming_the_field(model, tok, tokenizer_dir, path, body,
                                                                      context_logits, param, says):
    triton = CppBackendTriton(model, tok)
    status, raw = _post(tokenizer_dir, triton, path, {"model": MODEL, **body}, context_logits=context_logits)
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == param and says in err["message"] and not triton.asked


def test_a_model_without_any_log_prob_input_is_refused_and_the_portable_one_is_asked_as_before(model, tok,
                                                                                                tokenizer_dir):
    triton = CppBackendTriton(model, tok, inputs=("text_input", "max_tokens"))
    status, raw = _post(tokenizer_dir, triton, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "logprobs": 0})
    assert status == 400 and json.loads(raw)["error"]["param"] == "logprobs" and not triton.asked
    portable = PortableTriton(model, tok)
    status, _ = _post(tokenizer_dir, portable, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "logprobs": 2,
                                                                   "max_tokens": 2})
    assert status == 200 and portable.asked[0][2] == LOG_PROB_OUTPUTS and portable.asked[0][1]["num_top_logprobs"] == 2


def test_prompt_arrays_shapes_dtypes_and_a_mismatch(model, tok):
    ids = tok.encode(PROMPT)
    logits = _logits(model, ids)
    out = prompt_arrays(ids, logits[None].astype(np.float16), 3)  # the backend may declare FP16 logits
    n = len(ids) - 1
    assert out["prompt_log_probs"].shape == (n,) and out["prompt_log_probs"].dtype == np.float32
    assert out["prompt_top_token_ids"].shape == (n, 3) and out["prompt_top_token_ids"].dtype == np.int32
    assert (np.diff(out["prompt_top_log_probs"], axis=1) <= 0).all()  # most likely first
    assert set(prompt_arrays(ids, logits, 0)) == {"prompt_log_probs"}
    with pytest.raises(ValueError, match="tokenize differently"):
        prompt_arrays(ids[1:], logits, 0)


def test_the_grpc_response_carries_context_logits_to_the_prompt_arrays():
    """pipeline.openai_triton reads context_logits from the raw gRPC response (FP32 or FP16) into the prompt arrays."""
    from tritonclient.grpc import service_pb2

    from pipeline.openai_triton import _raw_logprobs

    for dtype, name in ((np.float32, "FP32"), (np.float16, "FP16")):
        logits = np.arange(3 * 5, dtype=dtype).reshape(1, 3, 5)
        resp = service_pb2.ModelInferResponse()
        for out_name, arr, dt in (("output_token_ids", np.array([[7]], np.int32), "INT32"),
                                  ("output_log_probs", np.array([[[-0.5]]], np.float32), "FP32"),
                                  ("context_logits", logits, name)):
            out = resp.outputs.add()
            out.name, out.datatype = out_name, dt
            out.shape.extend(arr.shape)
            resp.raw_output_contents.append(arr.tobytes())
        lp, prompt = _raw_logprobs(resp)
        assert lp.ids == [7] and lp.logprobs == [-0.5] and lp.top_ids == [[]]
        np.testing.assert_array_equal(prompt["context_logits"], logits)
