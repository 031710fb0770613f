"""The OpenAI frontend's log probabilities without a server: the shapes built from token ids with SmolLM2's real
tokenizer (pipeline.openai_logprobs), the request fields' rules (pipeline.openai_requests), and whole answers and
streams from a scripted Triton (what each chunk carries, the echoed prompt, max_tokens 0, a runtime without them)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pipeline.openai_logprobs import FLOOR, TokenLogprobs, TokenTexts, chat_content, completion_logprobs
from pipeline.openai_requests import APIError, CompletionBody, FrontendConfig, prepare
from pipeline.openai_triton import LOG_PROB_OUTPUTS, Delta

MODEL = "m"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from tests.conftest import smollm2_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()), local_files_only=True)


def test_token_strings_and_bytes_follow_vllm_for_whole_and_half_characters(tok):
    """Each token decoded alone (special tokens kept); a byte-level token holding part of a character reads U+FFFD
    and its bytes are U+FFFD's UTF-8, as vLLM answers (OpenAI would give the token's own bytes)."""
    texts = TokenTexts(tok)
    half = tok.encode("北", add_special_tokens=False)
    assert len(half) > 1 and all(texts(t) == "\ufffd" for t in half)  # the precondition: 北 spans two tokens
    paris = tok.encode(" Paris", add_special_tokens=False)[0]
    lp = TokenLogprobs.of([paris, half[0], 2], [-0.5, -float("inf"), -1.0], [[paris, half[1]], [half[0], 5], [2, 0]],
                          [[-0.5, -2.0], [-3.0, -4.0], [-1.0, -9.5]])
    content = chat_content(texts, lp, 2)
    assert [c["token"] for c in content] == [" Paris", "\ufffd", "<|im_end|>"]
    assert content[0]["bytes"] == list(b" Paris") and content[1]["bytes"] == [239, 191, 189]
    assert content[1]["logprob"] == FLOOR == -9999.0  # -inf is not JSON
    assert [t["token"] for t in content[0]["top_logprobs"]] == [" Paris", "\ufffd"]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-0.5, -2.0]
    assert all(set(t) == {"token", "logprob", "bytes"} for c in content for t in c["top_logprobs"])
    json.dumps(content, allow_nan=False)
    assert chat_content(texts, lp, 0)[0]["top_logprobs"] == []


def test_completion_logprobs_hold_the_token_itself_and_the_prompts_first_token_is_null(tok):
    texts = TokenTexts(tok)
    ids = tok.encode("The capital", add_special_tokens=False)  # "The", " capital"
    prompt = TokenLogprobs.prompt(ids, np.array([-4.0], np.float32), np.array([[7, 8]]), np.array([[-1.0, -2.0]]))
    assert prompt.logprobs == [None, -4.0] and prompt.top_ids[0] is None
    whole = TokenLogprobs()
    whole.extend(prompt)
    whole.extend(TokenLogprobs.of([ids[1]], [-0.25], [[ids[1], 9]], [[-0.25, -3.0]]))
    out = completion_logprobs(texts, whole, 2, offset=0)
    assert out["tokens"] == ["The", " capital", " capital"]
    assert out["token_logprobs"] == [None, -4.0, -0.25]
    # k most likely and the token itself: up to k + 1 entries (OpenAI's rule); the greedy token is the first
    assert out["top_logprobs"][0] is None
    assert out["top_logprobs"][1] == {texts(7): -1.0, texts(8): -2.0, " capital": -4.0}
    assert out["top_logprobs"][2] == {" capital": -0.25, texts(9): -3.0}
    assert out["text_offset"] == [0, 3, 11]
    assert completion_logprobs(texts, whole[2:], 0, offset=11)["top_logprobs"] == [{" capital": -0.25}]
    with pytest.raises(ValueError, match="tokenize differently"):
        TokenLogprobs.prompt(ids, [-1.0, -2.0])
    with pytest.raises(ValueError, match="do not match its tokens"):
        TokenLogprobs.of([1, 2], [-1.0])


def test_two_tokens_of_one_string_keep_the_more_likely_value(tok):
    """Completions' top_logprobs is a dict by token string: two ids reading U+FFFD give one entry, the more likely's
    (so lm-evaluation-harness's max(top.values()) is the top token's)."""
    texts = TokenTexts(tok)
    a, b = tok.encode("北", add_special_tokens=False)[:2]
    out = completion_logprobs(texts, TokenLogprobs.of([b], [-2.0], [[a, b]], [[-1.0, -2.0]]), 2)
    assert out["top_logprobs"] == [{"\ufffd": -1.0}]


def _cfg(tokenizer_dir, **kw):
    return FrontendConfig("127.0.0.1:1", MODEL, tokenizer_dir, 256, 512, **kw)


def test_request_fields_map_onto_the_runtime_inputs(tok):
    from pipeline.openai_requests import chat_request, completion_request

    cfg = _cfg(None)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    body, prompt = chat_request(tok, {**chat, "logprobs": True, "top_logprobs": 3})
    p = prepare(cfg, tok, body, prompt, True)
    assert p.logprobs == 3 and p.extra["return_log_probs"] and p.extra["num_top_logprobs"] == 3
    assert "return_prompt_log_probs" not in p.extra and not p.echo
    body, prompt = chat_request(tok, {**chat, "logprobs": True})
    p = prepare(cfg, tok, body, prompt, True)
    assert p.logprobs == 0 and "num_top_logprobs" not in p.extra
    body, prompt = chat_request(tok, chat)
    assert prepare(cfg, tok, body, prompt, True).logprobs is None
    body, [prompt] = completion_request(tok, {"model": MODEL, "prompt": "Hi there", "max_tokens": 0, "echo": True,
                                              "logprobs": 1})
    p = prepare(cfg, tok, body, prompt, False)
    assert (p.logprobs, p.echo, p.generate, p.max_tokens) == (1, True, False, 1)  # one token, dropped
    assert p.extra["return_prompt_log_probs"] and list(p.prompt_ids) == tok.encode("Hi there")


@pytest.mark.parametrize("body,param,says", [
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": False, "top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "greater than or equal to 0"),
    ({"logprobs": 1}, "logprobs", "valid boolean"),
    ({"logprobs": "yes"}, "logprobs", "valid boolean"),
])
def test_bad_chat_logprobs_are_400s_naming_the_field(tok, body, param, says):
    from pipeline.openai_requests import chat_request

    with pytest.raises(APIError) as err:
        b, prompt = chat_request(tok, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **body})
        prepare(_cfg(None), tok, b, prompt, True)
    assert err.value.status == 400 and err.value.param == param and says in err.value.message


@pytest.mark.parametrize("body,param,says", [
    ({"logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"logprobs": -1}, "logprobs", "greater than or equal to 0"),
    ({"logprobs": True}, "logprobs", "valid integer"),
    ({"echo": "yes"}, "echo", "valid boolean"),
    ({"max_tokens": 0}, "max_tokens", "echo: true to score the prompt"),
    ({"max_tokens": -1}, "max_tokens", "greater than or equal to 0"),
])
def test_bad_completion_logprobs_are_400s_naming_the_field(tok, body, param, says):
    from pipeline.openai_requests import completion_request

    with pytest.raises(APIError) as err:
        completion_request(tok, {"model": MODEL, "prompt": "Hi", **body})
    assert err.value.status == 400 and err.value.param == param and says in err.value.message


def test_an_id_prompt_without_the_bos_the_tokenizer_adds_is_echoed_as_sent():
    """lm-evaluation-harness sends ids without BOS and reads token_logprobs[len(context):-1]: where tokenizing the
    text adds a BOS, the echo leaves it out so the client's tokens line up with what it sent."""
    from types import SimpleNamespace

    from pipeline.openai_requests import _echo_from

    llama3 = SimpleNamespace(bos_token_id=128000)  # a tokenizer that adds BOS (SmolLM2's adds none)
    ids = [791, 6864, 315]
    [sent] = CompletionBody.model_validate({"model": MODEL, "prompt": [ids], "echo": True}).prompts()
    assert _echo_from(llama3, sent, [128000] + ids) == 1
    assert _echo_from(llama3, sent, ids) == 0
    assert _echo_from(llama3, [128000] + ids, [128000] + ids) == 0  # the client sent the BOS itself
    assert _echo_from(llama3, "Hi there", [128000] + ids) == 0


class LogprobTriton:
    """A scripted Triton answering with ``deltas`` (carrying log probabilities) and declaring ``inputs``."""

    def __init__(self, deltas, inputs=("num_top_logprobs",)):
        self.deltas, self._inputs, self.asked = deltas, set(inputs), []

    async def ready(self):
        return True

    async def inputs(self):
        return self._inputs

    async def generate(self, prompt, max_tokens, stop, extra, logprobs=False):
        self.asked.append((max_tokens, dict(extra), logprobs))
        for d in self.deltas:
            yield d


def _post(tokenizer_dir, triton, path, body):
    from tests.pipeline.test_openai_inflight import _call
    from pipeline.openai_frontend import create_app

    app = create_app(_cfg(tokenizer_dir, add_special_tokens=True), triton=triton)
    status, raw = asyncio.run(_call(app, path, body))
    return status, raw


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tests.conftest import smollm2_tokenizer_dir

    return smollm2_tokenizer_dir()


def _scripted(tok, prompt):
    """Two responses of one token each, the first with the prompt's arrays (k = 2)."""
    n = len(tok.encode(prompt))
    a, b = tok.encode(" Paris.", add_special_tokens=False)[:2]
    arrays = {"prompt_log_probs": np.full((1, n - 1), -1.5, np.float32),
              "prompt_top_log_probs": np.tile(np.array([-0.5, -1.5], np.float32), (1, n - 1, 1)),
              "prompt_top_token_ids": np.tile(np.array([a, b], np.int32), (1, n - 1, 1))}
    return [Delta(0, " Paris", 1, TokenLogprobs.of([a], [-0.25], [[a, b]], [[-0.25, -2.0]]), arrays),
            Delta(0, ".", 1, TokenLogprobs.of([b], [-0.75], [[b, a]], [[-0.75, -1.0]]))]


def test_streamed_chunks_carry_their_own_tokens_and_the_echo_comes_first(tok, tokenizer_dir):
    prompt = "The capital"
    triton = LogprobTriton(_scripted(tok, prompt))
    status, raw = _post(tokenizer_dir, triton, "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 2, "stream": True})
    chunks = [json.loads(e[len("data: "):]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    assert status == 200 and triton.asked[0][2] == LOG_PROB_OUTPUTS and triton.asked[0][1]["return_prompt_log_probs"]
    echo, first, second = (c["choices"][0] for c in chunks[:3])
    assert echo["text"] == prompt and echo["logprobs"]["tokens"] == ["The", " capital"]
    assert echo["logprobs"]["token_logprobs"] == [None, -1.5] and echo["logprobs"]["text_offset"] == [0, 3]
    assert first["text"] == " Paris" and first["logprobs"]["tokens"] == [" Paris"]
    assert first["logprobs"]["text_offset"] == [len(prompt)] and first["logprobs"]["token_logprobs"] == [-0.25]
    assert second["logprobs"]["tokens"] == ["."] and second["logprobs"]["text_offset"] == [len(prompt) + 6]
    assert chunks[3]["choices"][0]["finish_reason"] == "length" and chunks[3]["choices"][0]["logprobs"] is None


def test_echo_with_max_tokens_0_scores_the_prompt_alone(tok, tokenizer_dir):
    prompt = "The capital"
    status, raw = _post(tokenizer_dir, LogprobTriton(_scripted(tok, prompt)), "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})
    out = json.loads(raw)
    choice = out["choices"][0]
    assert status == 200 and choice["text"] == prompt and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["The", " capital"] and out["usage"]["completion_tokens"] == 0


def test_whole_chat_answer_and_a_runtime_without_them(tok, tokenizer_dir):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "logprobs": True,
            "top_logprobs": 1}
    status, raw = _post(tokenizer_dir, LogprobTriton(_scripted(tok, "x")), "/v1/chat/completions", chat)
    choice = json.loads(raw)["choices"][0]
    assert status == 200 and choice["message"]["content"] == " Paris."
    assert [c["token"] for c in choice["logprobs"]["content"]] == [" Paris", "."]
    assert [len(c["top_logprobs"]) for c in choice["logprobs"]["content"]] == [1, 1]
    triton = LogprobTriton([], inputs=("text_input", "max_tokens"))  # the C++ backend's repository
    status, raw = _post(tokenizer_dir, triton, "/v1/chat/completions", chat)
    err = json.loads(raw)["error"]
    assert status == 400 and err["param"] == "logprobs" and "runtime pytorch" in err["message"] and not triton.asked
    status, _ = _post(tokenizer_dir, triton, "/v1/chat/completions", {**chat, "logprobs": None, "top_logprobs": None})
    assert status == 200  # without log probabilities it is served


def test_a_leading_bos_id_is_kept_where_the_tokenizer_adds_none(tok):
    """With add_special_tokens (as the preprocessing model tokenizes), a leading BOS id is left for the tokenizer to
    add only where it adds one: SmolLM2's adds none, so [bos, a, b] is scored as sent, all three tokens."""
    from pipeline.openai_requests import completion_request

    bos = tok.bos_token_id
    assert bos is not None and tok.encode("a", add_special_tokens=True)[:1] != [bos]  # the precondition
    ids = [bos] + tok.encode(" Paris is", add_special_tokens=False)
    body, [prompt] = completion_request(tok, {"model": MODEL, "prompt": ids, "max_tokens": 0, "echo": True,
                                              "logprobs": 0}, add_special_tokens=True)
    assert tok.encode(prompt, add_special_tokens=True) == ids
