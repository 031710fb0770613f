"""LoRA adapters end to end: two real PEFT adapters of the embedded SmolLM2-135M-Instruct, built into one build with
``lora.adapters``, served by the real tritonserver and the OpenAI frontend ``trtpipe serve`` starts beside it, and
asked through the official ``openai`` client, Triton's gRPC stream and the load tester. No mocks.

The adapters are made with PEFT's own API (``init_lora_weights=False``: random A and B, so each changes the model's
answers), with different target modules and ranks, by the session fixtures of tests/conftest.py (lora_build,
lora_server), which tests/test_lora_e2e.py shares.
"""

from __future__ import annotations

import argparse
import urllib.request

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BUILD = "smol-lora"
"""The build of tests/conftest.py lora_build (adapters fr: task id 1, de: task id 2, made there with PEFT's API)."""
QUESTION = "What is the capital of France?"
PROMPTS = ["東京と京都について一文で教えてください。", "Écris une phrase sur les crêpes et le café ☕.",
           "Tell me a story about a 🐉 and a 🦄 in one sentence."]


@pytest.fixture(scope="module")
def served(lora_build, lora_server, tmp_path_factory):
    """The LoRA build's tritonserver (tests/conftest.py lora_server) and the OpenAI frontend as ``trtpipe serve``
    launches it (its adapters from the build's plan.json)."""
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports

    build, folder, _ = lora_build
    (openai_port,) = free_ports(1)
    launch = frontend_launch(build, lora_server.cfg, openai_port, folder / "engine")
    assert launch.adapters == {"fr": 1, "de": 2}
    launch.log_file = tmp_path_factory.mktemp("lora-logs") / "openai_frontend.log"
    launch.triton_pid = lora_server.proc.pid
    frontend = OpenAIFrontend(launch).start()
    try:
        yield lora_server, frontend
    finally:
        frontend.stop(10)


@pytest.fixture
def client(served):
    import openai

    return openai.OpenAI(base_url=served[1].launch.url + "/v1", api_key="unused", max_retries=0)


def _chat(client, model: str, content: str = QUESTION, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=kw.pop("max_tokens", 16), temperature=0, **kw)


def test_v1_models_lists_the_base_and_each_adapter_with_its_parent(client, lora_build):
    _, _, paths = lora_build
    models = client.models.list().data
    assert [m.id for m in models] == [BUILD, "fr", "de"]
    cards = {m.id: m.model_dump() for m in models}
    assert cards[BUILD]["parent"] is None and cards[BUILD]["root"] == BUILD
    for name in ("fr", "de"):
        assert cards[name]["parent"] == BUILD and cards[name]["root"] == str(paths[name])
        assert client.models.retrieve(name).model_dump() == cards[name]


def test_each_adapter_gives_its_own_greedy_answer_and_the_answer_names_it(client, served, lora_build):
    """Three different greedy answers; the base answers the same before and after the adapters ran; trtllm-serve's
    lora_request selects the same adapter as its name; the frontend's text is Triton's own for that task id."""
    from pipeline.client import format_chat, stream_generate

    _, folder, _ = lora_build
    answers = {}
    for model in (BUILD, "fr", "de"):
        r = _chat(client, model)
        assert r.model == model and r.usage.completion_tokens > 0
        answers[model] = r.choices[0].message.content
    assert len(set(answers.values())) == 3, answers
    assert _chat(client, BUILD).choices[0].message.content == answers[BUILD]
    by_request = _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "de", "lora_int_id": 2}})
    assert by_request.choices[0].message.content == answers["de"] and by_request.model == BUILD
    prompt = format_chat(folder / "engine", QUESTION)
    for model, task in (("fr", 1), ("de", 2)):
        direct = stream_generate(served[0].cfg.grpc_url, prompt, 16, extra={"lora_task_id": task}, timeout_s=120)
        assert "".join(c.text for c in direct) == answers[model]
    completion = client.completions.create(model="fr", prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
    base = client.completions.create(model=BUILD, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert completion.model == "fr" and completion.choices[0].text != base.choices[0].text


@pytest.mark.parametrize("model", [BUILD, "fr", "de"])
def test_non_ascii_prompts_streamed_and_not_keep_every_character(client, model):
    for content in PROMPTS:
        whole = _chat(client, model, content, max_tokens=24)
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=24, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        assert all(c.model == model for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
        done = client.completions.create(model=model, prompt=content, max_tokens=12, temperature=0)
        streamed = client.completions.create(model=model, prompt=content, max_tokens=12, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text


def test_an_unknown_model_or_adapter_is_a_404_and_a_new_lora_path_a_400(client, served):
    import openai

    with pytest.raises(openai.NotFoundError) as err:
        _chat(client, "gpt-4o")
    body = err.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert f"'{BUILD}', 'fr', 'de'" in body["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError):
        _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "nope"}})
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "fr", "lora_int_id": 1,
                                                          "lora_path": "/somewhere/else"}})
    assert "fixed at build time" in err.value.body["message"]
    assert _chat(client, "fr").choices[0].message.content  # still serving
    text = urllib.request.urlopen(served[1].launch.url + "/metrics", timeout=10).read().decode()
    assert 'trtpipe_openai_model_requests_total{model="fr"}' in text


def test_an_unknown_task_id_is_an_error_from_the_model(served, lora_build):
    from pipeline.client import RequestFailed, stream_generate

    with pytest.raises(RequestFailed):
        list(stream_generate(served[0].cfg.grpc_url, "Hello", 4, extra={"lora_task_id": 99}, timeout_s=60))


@pytest.mark.parametrize("endpoint", ["triton", "openai-chat"])
def test_the_load_tester_spreads_requests_over_the_models_and_reports_each(served, lora_build, endpoint):
    from pipeline.loadtest.api import run_loadtest
    from pipeline.loadtest.cli import lora_task_ids
    from pipeline.loadtest.config import LoadTestConfig

    build, folder, _ = lora_build
    server, frontend = served
    models = ["fr", "de", BUILD]
    args = argparse.Namespace(build=build.spec_path, target="cpu", quant=None, runtime=None, out=None)
    cfg = LoadTestConfig(url=server.cfg.grpc_url if endpoint == "triton" else frontend.launch.url + "/v1",
                         endpoint=endpoint, model="ensemble", models=models, concurrency=[2], num_requests=6,
                         warmup=0, input_len="16", output_len="4", tokenizer_dir=folder / "engine",
                         perf_metrics=False, lora_task_ids=lora_task_ids(args, folder) if endpoint == "triton" else {})
    report = run_loadtest(cfg)
    point = report["points"][0]
    assert point["summary"]["requests"]["completed"] == 6, point["summary"]["first_error"]
    per = point["summary"]["by_model"]
    assert list(per) == models and all(s["requests"]["completed"] == 2 for s in per.values())
    assert all(s["ttft_s"]["n"] == 2 and s["output_token_throughput"] for s in per.values())
    assert [r["model"] for r in point["requests"]] == models * 2
