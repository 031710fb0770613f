"""The OpenAI-compatible frontend against the real tritonserver serving the default build, through the official
``openai`` client (sync, async, streaming) and raw HTTP: answers, usage counts, errors with the server alive
afterwards, and a client that goes away mid-stream freeing its KV blocks."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from pipeline.openai_frontend import APIError, triton_error

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(frontend):
    import openai

    return openai.OpenAI(base_url=frontend.launch.url + "/v1", api_key="unused", max_retries=0)


def _metric(url: str, name: str, label: str = "") -> float:
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {label} not exported by {url}")


def test_chat_answers_and_usage_counts_are_the_servers(client, default_server, built_default):
    from pipeline.client import format_chat, stream_generate
    from transformers import AutoTokenizer

    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    assert "Paris" in r.choices[0].message.content and r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    prompt = format_chat(built_default / "engine", QUESTION[0]["content"])
    direct = list(stream_generate(default_server.cfg.grpc_url, prompt, 24))
    assert r.usage.completion_tokens == sum(c.num_tokens for c in direct)  # the server's own count
    assert r.choices[0].message.content == "".join(c.text for c in direct)
    tok = AutoTokenizer.from_pretrained(str(built_default / "engine"))
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=True))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_chat_sends_openai_chunks_and_usage_last(client):
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len([c for c in chunks if c.choices]) > 3
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_length_limit_seed_and_n(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    sampled = [client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                         seed=7).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]  # the seed reaches the sampler
    many = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=2, temperature=1.0,
                                     seed=3)
    assert sorted(c.index for c in many.choices) == [0, 1] and many.usage.completion_tokens == 16
    # each sampled sequence is its own choice, whole, streamed and not (all went to choice 0)
    assert all(c.text for c in many.choices), many.choices
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, n=3, temperature=1.0, seed=5)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert all(c.message.content for c in chat.choices), chat.choices
    streamed: dict = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, n=3, temperature=1.0,
                                                seed=5, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
    assert sorted(streamed) == [0, 1, 2] and all(streamed.values()), streamed


def test_stop_sequences_end_the_answer(client):
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 30


@pytest.mark.parametrize("stop", [["7"], [", 7"], ["nope", "6, 7"]], ids=["inside-a-token", "across-tokens", "second"])
def test_stop_strings_match_the_text_wherever_they_fall_and_are_left_out(client, stop):
    """As OpenAI and vLLM: matched on the decoded text ("7" is inside the token " 7"; ", 7" spans two tokens), the
    answer ends just before it, streamed and not, with finish_reason "stop"."""
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0).choices[0].text
    cut = min(i for i in (free.find(s) for s in stop) if i >= 0)  # the precondition: the free answer has it
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=stop)
    assert r.choices[0].text == free[:cut] and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == free[:cut]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    chat = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stop=["Paris"])
    assert "Paris" not in chat.choices[0].message.content and chat.choices[0].finish_reason == "stop"


def test_what_openai_answers_is_answered(client):
    """Requests OpenAI answers and this frontend once refused or dropped: n > 1 greedy (n equal choices), top_p 0
    (greedy), a negative seed, vLLM's top_k, and tools with tool_choice "none" (answered as text)."""
    greedy = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    text = greedy.choices[0].message.content
    two = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, n=2)
    assert [c.message.content for c in two.choices] == [text, text] and [c.index for c in two.choices] == [0, 1]
    assert two.usage.completion_tokens == 2 * greedy.usage.completion_tokens
    streamed = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, n=2,
                                                   stream=True))
    for i in (0, 1):
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == i) \
            == text
    top_p0 = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0.8, top_p=0)
    assert top_p0.choices[0].message.content == text
    seeded = [client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=1.0,
                                             seed=-7, extra_body={"top_k": 5}).choices[0].message.content
              for _ in range(2)]
    assert seeded[0] == seeded[1]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    off = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0, tools=tools,
                                         tool_choice="none")
    assert off.choices[0].message.content and off.choices[0].finish_reason in ("stop", "length")


def test_a_token_id_prompt_is_answered_as_its_text(client, built_default):
    """OpenAI's spec allows a completion prompt of token ids ([int] or [[int]]; lm-evaluation-harness's
    local-completions sends them by default): the answer is the text prompt's."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built_default / "engine"), local_files_only=True)
    text = "The capital of France is"
    ids = tok.encode(text, add_special_tokens=False)
    want = client.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0).choices[0].text
    for prompt in (ids, [ids]):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        assert r.choices[0].text == want and r.usage.prompt_tokens == len(ids)
    import openai

    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=MODEL, prompt=[len(tok) + 5], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="streams one prompt per request"):
        client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=4, stream=True)


def test_several_prompts_in_one_completion_are_answered_as_openai_does(client, built_default):
    """A list of prompts (text or token ids; lm-evaluation-harness's --batch_size) is answered as OpenAI's legacy
    endpoint does: prompt p's choice j has index p x n + j, each choice what the prompt alone gets, usage summed;
    one bad prompt fails the request, naming it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built_default / "engine"), local_files_only=True)
    texts = ["The capital of France is", "日本の首都は", "Once upon a time"]
    alone = [client.completions.create(model=MODEL, prompt=t, max_tokens=6, temperature=0) for t in texts]
    for prompts in (texts, [tok.encode(t, add_special_tokens=False) for t in texts]):
        r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, n=2)
        assert [c.index for c in r.choices] == list(range(6))
        assert [c.text for c in r.choices] == [a.choices[0].text for a in alone for _ in range(2)]
        assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
        assert r.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    import openai

    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=MODEL, prompt=[tok.encode(texts[0]), [len(tok) + 5]], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"prompt\[1\] \(of 3\): prompt: the prompt is \d+ tokens"):
        client.completions.create(model=MODEL, prompt=[texts[0], "Paris " * 1500, texts[2]], max_tokens=4)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chinese_and_emoji_answers_keep_every_character(client, stream):
    """Characters whose UTF-8 bytes span two tokens (CJK, emoji) come out whole, streamed and not, and the streamed
    deltas joined are the whole answer."""
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "请用中文介绍一下北京和上海。🎉"}], max_tokens=40,
               temperature=0)
    whole = client.chat.completions.create(**ask).choices[0].message.content
    assert any("\u4e00" <= ch <= "\u9fff" for ch in whole), whole  # the precondition: it answers in Chinese
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True)
                       if c.choices)
        assert text == whole
    assert "\ufffd" not in whole, whole


def test_async_streaming_completions(frontend):
    import openai

    async def go():
        async with openai.AsyncOpenAI(base_url=frontend.launch.url + "/v1", api_key="unused") as c:
            pieces = []
            async for chunk in await c.completions.create(model=MODEL, prompt="The capital of France is",
                                                          max_tokens=6, temperature=0, stream=True):
                pieces.append(chunk.choices[0].text)
            models = await c.models.list()
            return "".join(pieces), [m.id for m in models.data]

    text, models = asyncio.run(go())
    assert "Paris" in text and models == [MODEL]


@pytest.mark.parametrize("kwargs,status,param", [
    (dict(model="no-such-model"), 404, "model"),
    (dict(temperature=5.0), 400, "temperature"),
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(max_tokens=5000), 400, "max_tokens"),
    (dict(top_logprobs=2), 400, "top_logprobs"),
    (dict(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (dict(n=99), 400, "n"),
    (dict(messages=[{"role": "user", "content": "word " * 1500}]), 400, "messages"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), 400, "tool_choice"),
])
def test_errors_are_openai_errors_and_the_server_keeps_serving(client, kwargs, status, param):
    import openai

    args = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**args)
    assert err.value.status_code == status
    body = err.value.body
    assert body["param"] == param and body["type"] == "invalid_request_error" and body["message"]
    assert "Paris" in client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16,
                                                     temperature=0).choices[0].message.content


def test_bad_json_and_unknown_route(frontend):
    conn = http.client.HTTPConnection("127.0.0.1", frontend.launch.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=b"{not json", headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 400 and "not JSON" in json.loads(resp.read())["error"]["message"]
    conn.request("GET", "/v1/models/other")
    resp = conn.getresponse()
    assert resp.status == 404 and json.loads(resp.read())["error"]["code"] == "model_not_found"


def test_a_client_leaving_mid_stream_cancels_its_request_and_frees_the_blocks(frontend, default_server):
    metrics = f"http://127.0.0.1:{default_server.cfg.metrics_port}/metrics"
    total = _metric(metrics, "trtpipe_runtime_kv_cache_blocks", 'state="total"')
    cancelled = _metric(metrics, "trtpipe_runtime_total", 'kind="cancelled"')
    fe_cancelled = _metric(frontend.launch.url + "/metrics", "trtpipe_openai_cancelled_total")  # the session's
    conn = http.client.HTTPConnection("127.0.0.1", frontend.launch.port, timeout=120)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 1500,
            "temperature": 0, "stream": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = 0
    while seen < 6:  # some tokens arrive: the request holds KV blocks
        if resp.readline().startswith(b"data: "):
            seen += 1
    assert _metric(metrics, "trtpipe_runtime_kv_cache_blocks", 'state="free"') < total
    conn.sock.close()  # the client goes away
    conn.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            _metric(metrics, "trtpipe_runtime_kv_cache_blocks", 'state="free"') == total
            and _metric(metrics, "trtpipe_runtime_requests", 'state="inflight"') == 0):
        time.sleep(0.2)
    assert _metric(metrics, "trtpipe_runtime_kv_cache_blocks", 'state="free"') == total, "blocks not given back"
    # by the cancellation, not by running on to 1500 tokens (minutes on CPU)
    assert _metric(metrics, "trtpipe_runtime_total", 'kind="cancelled"') == cancelled + 1
    assert _metric(frontend.launch.url + "/metrics", "trtpipe_openai_cancelled_total") == fe_cancelled + 1
    urllib.request.urlopen(frontend.launch.url + "/health", timeout=10)  # 200: still serving


def test_frontend_without_triton_answers_503(built_default, tmp_path):
    """Triton down: /health and requests answer 503 (not a hang, not a 500)."""
    from pipeline.launch_config import FrontendLaunch
    from pipeline.serve import OpenAIFrontend, free_ports

    dead, port = free_ports(2)
    launch = FrontendLaunch(f"127.0.0.1:{dead}", MODEL, built_default / "engine", 1024, 2048, True, port=port,
                            log_file=tmp_path / "fe.log")
    fe = OpenAIFrontend(launch)
    fe._spawn(launch.argv(), dict(__import__("os").environ), False)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                urllib.request.urlopen(launch.url + "/health", timeout=5)
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                time.sleep(0.3)
        assert status == 503
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": MODEL, "messages": QUESTION}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 503 and json.loads(resp.read())["error"]["code"] == "unavailable"
    finally:
        fe.stop(10)


@pytest.mark.parametrize("message,status", [
    ("prompt 2000 + request_output_len 8 exceeds max_input_len 1024 / max_seq_len 2048", 400),
    ("Exceeds maximum queue size", 503),
    ("failed to connect to all addresses", 503),
    ("top_p = 1.5: must be in [0, 1]", 400),
    ("generation failed: CUDA error", 500),
    ("the server is shutting down (tritonserver is stopping): this request was ended before it finished", 503),
])
def test_triton_errors_map_to_http_statuses(message, status):
    err = triton_error(message)
    assert isinstance(err, APIError) and err.status == status and message in err.message


def test_the_load_tester_speaks_openai_and_counts_the_servers_tokens(frontend, default_server):
    """`trtpipe loadtest` on the chat endpoint: every request exactly its max_tokens (ignore_eos), and the tokens it
    counts are the ones the runtime says it generated and the frontend says it sent."""
    from pipeline.loadtest.api import run_loadtest
    from pipeline.loadtest.config import LoadTestConfig

    metrics = f"http://127.0.0.1:{default_server.cfg.metrics_port}/metrics"
    generated = _metric(metrics, "trtpipe_runtime_total", 'kind="tokens"')
    sent = _metric(frontend.launch.url + "/metrics", "trtpipe_openai_tokens_total", 'kind="completion"')
    for endpoint in ("openai-chat", "openai-completions"):
        cfg = LoadTestConfig(url=frontend.launch.url + "/v1", endpoint=endpoint, mode="closed", concurrency=[2],
                             num_requests=4, input_len="24", output_len="6", warmup=0, fixed_output="ignore_eos",
                             tokenizer_dir=frontend.launch.tokenizer_dir, shared_prefixes=2, shared_prefix_len=40)
        rep = run_loadtest(cfg)
        point = rep["points"][0]
        assert rep["server"]["model"]["name"] == MODEL and point["summary"]["requests"]["failed"] == 0
        reqs = point["requests"]
        assert [r["output_tokens"] for r in reqs] == [6] * 4
        assert all(r["server"]["tokens_from"] == "usage" and r["input_tokens"] > 40 for r in reqs)
        assert point["summary"]["ttft_s"]["n"] == 4 and point["summary"]["itl_s_pooled"]["n"] > 0
    deadline = time.monotonic() + 10  # the runtime publishes its counters every cancellation_check_period_ms
    while _metric(metrics, "trtpipe_runtime_total", 'kind="tokens"') - generated < 48 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(metrics, "trtpipe_runtime_total", 'kind="tokens"') - generated == 48
    assert _metric(frontend.launch.url + "/metrics", "trtpipe_openai_tokens_total", 'kind="completion"') - sent == 48


# ---- log probabilities: equal to transformers' own log_softmax of the served weights -------------------------------

CJK_PROMPT = "北京是中国的首都🎉 The capital of France is"


@pytest.fixture(scope="module")
def reference(built_default):
    """transformers on the build's engine folder (the weights the runtime serves, float32 as the cpu target):
    ``reference(ids, steps, k)`` -> (log_softmax of every position of ids + the greedy continuation [len, vocab],
    the continuation's ids), and the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = built_default / "engine"
    model = AutoModelForCausalLM.from_pretrained(str(engine), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(engine), local_files_only=True)

    def run(ids, steps):
        ids = list(ids)
        out = []
        with torch.no_grad():
            for _ in range(steps):  # greedy, one plain forward per token
                lsm = torch.log_softmax(model(torch.tensor([ids + out])).logits[0].float(), dim=-1)
                out.append(int(torch.argmax(lsm[-1])))
            lsm = torch.log_softmax(model(torch.tensor([ids + out])).logits[0].float(), dim=-1)
        return lsm, out

    run.tok = tok
    return run


def _top_dict(tok, lsm_row, token, k):
    """Completions' top_logprobs entry as documented (pipeline.openai_logprobs): the k most likely by string, the
    first of a string kept, and the token itself."""
    import torch

    values, ids = torch.topk(lsm_row, k)
    want = {}
    for t, v in zip(ids.tolist(), values.tolist()):
        want.setdefault(tok.decode([t]), v)
    want.setdefault(tok.decode([token]), float(lsm_row[token]))
    return want


def _joined(chunks):
    """A streamed completion's logprobs, chunk after chunk, as one object (text_offset as sent)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        lp = c.choices[0].logprobs if c.choices else None
        for key in out if lp else ():
            out[key] += getattr(lp, key)
    return out


def test_completions_echo_logprobs_are_transformers_log_softmax(client, reference):
    """echo + logprobs k on a CJK/emoji prompt: every prompt token (the first null) and every generated token, with
    its k most likely alternatives (sorted, holding the greedy token first), equal to log_softmax of transformers'
    forward within 1e-4; the text is the prompt then the answer; streamed, each chunk carries its own tokens' and the
    whole is the same."""
    tok = reference.tok
    ids = tok.encode(CJK_PROMPT, add_special_tokens=True)
    lsm, gen = reference(ids, 4)
    r = client.completions.create(model=MODEL, prompt=CJK_PROMPT, max_tokens=4, temperature=0, logprobs=3, echo=True)
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text == CJK_PROMPT + tok.decode(gen) and r.usage.completion_tokens == len(gen) == 4
    assert r.usage.prompt_tokens == len(ids)
    assert lp.tokens == [tok.decode([t]) for t in ids + gen] and "\ufffd" in lp.tokens  # half characters: vLLM's
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = [float(lsm[j - 1, t]) for j, t in enumerate(ids + gen) if j]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-4)
    for j, t in enumerate(ids + gen):
        if j:
            top = lp.top_logprobs[j]
            expected = _top_dict(tok, lsm[j - 1], t, 3)
            assert list(top) == list(expected) and list(top.values()) == pytest.approx(list(expected.values()),
                                                                                        abs=1e-4)
            assert list(top.values())[:3] == sorted(list(top.values())[:3], reverse=True)
            if j >= len(ids):  # generated greedily: the most likely token
                assert max(top.values()) == lp.token_logprobs[j]
    assert lp.text_offset == [sum(len(x) for x in lp.tokens[:j]) for j in range(len(lp.tokens))]
    chunks = list(client.completions.create(model=MODEL, prompt=CJK_PROMPT, max_tokens=4, temperature=0, logprobs=3,
                                            echo=True, stream=True))
    assert chunks[0].choices[0].text == CJK_PROMPT and len(chunks[0].choices[0].logprobs.tokens) == len(ids)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    streamed = _joined(chunks)
    assert streamed["tokens"] == lp.tokens and streamed["token_logprobs"] == lp.token_logprobs
    assert streamed["top_logprobs"] == lp.top_logprobs


def test_lm_evaluation_harness_loglikelihood_requests(client, reference):
    """What lm-evaluation-harness 0.4's local-completions sends for a loglikelihood request (openai_completions.py
    _create_payload: the context + continuation token ids, echo, logprobs 1, max_tokens 1, temperature 0, a seed) and
    how it reads the answer (parse_logprobs: sum(token_logprobs[ctxlen:-1]), greedy when each of those equals
    max(top_logprobs[...].values())); and the scoring-only form, max_tokens 0."""
    tok = reference.tok
    context = tok.encode("The capital of France is", add_special_tokens=False)
    for continuation, greedy in ((" Paris", True), (" Rome", False)):
        cont = tok.encode("The capital of France is" + continuation, add_special_tokens=False)[len(context):]
        tokens = context + cont
        r = client.completions.create(model=MODEL, prompt=[tokens], temperature=0, max_tokens=1, logprobs=1,
                                      seed=1234, echo=True)
        lp = r.choices[0].logprobs
        assert len(lp.token_logprobs) == len(tokens) + 1  # the prompt's tokens, then the one generated
        ctxlen = len(context)
        score = sum(lp.token_logprobs[ctxlen:-1])
        is_greedy = all(t == max(top.values()) for t, top in zip(lp.token_logprobs[ctxlen:-1],
                                                                   lp.top_logprobs[ctxlen:-1]))
        lsm, _ = reference(tokens, 0)
        assert score == pytest.approx(sum(float(lsm[j - 1, tokens[j]]) for j in range(ctxlen, len(tokens))),
                                      abs=1e-4 * len(cont))
        assert is_greedy is greedy
    r = client.completions.create(model=MODEL, prompt=[tokens], max_tokens=0, echo=True, logprobs=0)
    assert r.choices[0].logprobs.tokens == [tok.decode([t]) for t in tokens] and r.usage.completion_tokens == 0
    assert r.choices[0].text == tok.decode(tokens) and r.choices[0].finish_reason == "length"
    assert r.choices[0].logprobs.top_logprobs[1] == {tok.decode([tokens[1]]): r.choices[0].logprobs.token_logprobs[1]}


def test_chat_logprobs_and_top_logprobs_are_transformers_log_softmax(client, reference):
    """logprobs + top_logprobs 3 on a CJK/emoji question, whole and streamed: each token's string, UTF-8 bytes (a
    half character reads U+FFFD, vLLM's rule) and log probability, and its 3 most likely alternatives sorted with the
    greedy token first, equal to transformers' log_softmax within 1e-4; one entry per counted token."""
    tok = reference.tok
    messages = [{"role": "user", "content": "请用中文介绍一下北京。🎉"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=True)
    ask = dict(model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**ask)
    content = r.choices[0].logprobs.content
    lsm, gen = reference(ids, len(content))
    assert len(content) == r.usage.completion_tokens == 8 and r.choices[0].message.content == tok.decode(gen)
    import torch

    for j, (entry, t) in enumerate(zip(content, gen)):
        row = lsm[len(ids) - 1 + j]
        assert entry.token == tok.decode([t]) and entry.bytes == list(entry.token.encode("utf-8"))
        assert entry.logprob == pytest.approx(float(row[t]), abs=1e-4)
        values, top_ids = torch.topk(row, 3)
        assert [x.token for x in entry.top_logprobs] == [tok.decode([i]) for i in top_ids.tolist()]
        assert [x.logprob for x in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
        assert [x.logprob for x in entry.top_logprobs] == sorted([x.logprob for x in entry.top_logprobs], reverse=True)
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
    assert any(e.bytes == [239, 191, 189] for e in content)  # the precondition: a character spans two tokens
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob, [x.logprob for x in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [x.logprob for x in e.top_logprobs]) for e in content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == len(streamed)


@pytest.mark.parametrize("kwargs,param", [(dict(logprobs=21), "logprobs"), (dict(max_tokens=0), "max_tokens"),
                                          (dict(logprobs=-1), "logprobs"), (dict(suffix="x"), "suffix")])
def test_bad_completion_logprobs_are_400s_naming_the_field(client, kwargs, param):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**{"model": MODEL, "prompt": "Hi", "max_tokens": 2, **kwargs})
    assert err.value.body["param"] == param and err.value.body["message"]


def test_a_dead_bls_stub_turns_health_to_503_and_requests_to_unavailable(built_default, tmp_path):
    """Triton keeps a Python model READY after its stub process died (session 10 on an H100: tensorrt_llm_bls's stub
    died under the frontend's first request) and answers each request "Stub process ... is not healthy". The
    frontend's /health then says 503 (a load balancer stops sending), and requests get 503 ``unavailable``."""
    import os
    import signal

    import psutil

    from builders.spec import load_spec
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports
    from tests.conftest import DEFAULT_BUILD, start_server

    server = start_server(built_default / "model_repo", tmp_path)
    try:
        launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), server.cfg, free_ports(1)[0], built_default / "engine")
        launch.log_file = tmp_path / "openai_frontend.log"
        fe = OpenAIFrontend(launch).start()
        try:
            assert urllib.request.urlopen(launch.url + "/health", timeout=30).status == 200
            bls = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
                   if "tensorrt_llm_bls_0_0" in " ".join(p.cmdline())]
            assert len(bls) == 1, "no tensorrt_llm_bls stub under tritonserver"
            os.kill(bls[0].pid, signal.SIGKILL)
            deadline = time.monotonic() + 30  # dead: gone, or a zombie tritonserver has not reaped
            while bls[0].is_running() and bls[0].status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(launch.url + "/health", timeout=30)
            assert err.value.code == 503
            conn = http.client.HTTPConnection("127.0.0.1", launch.port, timeout=60)
            conn.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                         body=json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 4}))
            resp = conn.getresponse()
            body = json.loads(resp.read())
            assert resp.status == 503 and body["error"]["code"] == "unavailable", body
            assert "is not healthy" in body["error"]["message"]
        finally:
            fe.stop(10)
    finally:
        server.stop()
