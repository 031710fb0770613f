"""LoRA adapters end to end: two real PEFT adapters of the embedded SmolLM2-135M-Instruct, built into one build with
``lora.adapters``, served by the real tritonserver and the OpenAI frontend ``trtpipe serve`` starts beside it, and
asked through the official ``openai`` client, Triton's gRPC stream and the load tester. No mocks.

The adapters are made with PEFT's own API (``init_lora_weights=False``: random A and B, so each changes the model's
answers), with different target modules and ranks; the build is ``quant_algo: none`` (no calibration) to stay short.
"""

from __future__ import annotations

import argparse
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BUILD = "lora-e2e"
ADAPTERS = {"sql": (("q_proj", "v_proj"), 8, 64, 11), "poet": (("o_proj", "gate_proj", "down_proj"), 4, 8, 12)}
"""name -> (target modules, rank, lora_alpha, seed): attention alone needs a larger scale to change a short answer."""
QUESTION = "What is the capital of France?"
PROMPTS = ["東京と京都について一文で教えてください。", "Écris une phrase sur les crêpes et le café ☕.",
           "Tell me a story about a 🐉 and a 🦄 in one sentence."]


def make_adapter(base: Path, out: Path, modules: tuple[str, ...], rank: int, alpha: float, seed: int) -> Path:
    """One PEFT LoRA adapter of ``base`` saved in ``out`` (adapter_config.json, adapter_model.safetensors)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(modules),
                                                  init_lora_weights=False, lora_dropout=0.0))
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def lora_build(tmp_path_factory):
    """(the resolved build, its folder), built by the pipeline."""
    from builders.layout import build_dir
    from builders.model_fetch import resolve_source
    from builders.spec import load_spec
    from pipeline.build import run_build

    root = tmp_path_factory.mktemp("lora")
    base = resolve_source("embedded:smollm2-135m-instruct")
    paths = {name: make_adapter(base, root / "adapters" / name, *spec) for name, spec in ADAPTERS.items()}
    spec = root / f"{BUILD}.yaml"
    spec.write_text(f"""name: {BUILD}
model: {{source: "embedded:smollm2-135m-instruct"}}
runtime: pytorch
quantization: {{quant_algo: none}}
limits: {{max_batch_size: 4, max_input_len: 256, max_seq_len: 512, max_num_tokens: 512}}
gates: {{eval_samples: 2, eval_seq_len: 32}}
lora:
  adapters:
""" + "".join(f"    {name}: {path}\n" for name, path in paths.items()) + "targets: {cpu: {}}\n")
    build = load_spec(spec, "cpu")
    run_build(build, out_root=root / "build", progress=False)
    return build, build_dir(build, root / "build"), paths


@pytest.fixture(scope="module")
def served(lora_build, tmp_path_factory):
    """tritonserver on the build's repository and the OpenAI frontend as ``trtpipe serve`` launches it (its
    adapters from the build's plan.json)."""
    from model_repo.generate import default_sys_path
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, ServerConfig, TritonServer, free_ports

    build, folder, _ = lora_build
    http, grpc, metrics, openai_port = free_ports(4)
    logs = tmp_path_factory.mktemp("lora-logs")
    cfg = ServerConfig(model_repository=folder / "model_repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                       log_file=logs / "tritonserver.log", ready_timeout_s=300, python_path=default_sys_path())
    server = TritonServer(cfg).start()
    try:
        launch = frontend_launch(build, cfg, openai_port, folder / "engine")
        assert launch.adapters == {"sql": 1, "poet": 2}
        launch.log_file = logs / "openai_frontend.log"
        launch.triton_pid = server.proc.pid
        frontend = OpenAIFrontend(launch).start()
        try:
            yield server, frontend
        finally:
            frontend.stop(10)
    finally:
        server.stop()


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
    assert [m.id for m in models] == [BUILD, "sql", "poet"]
    cards = {m.id: m.model_dump() for m in models}
    assert cards[BUILD]["parent"] is None and cards[BUILD]["root"] == BUILD
    for name in ("sql", "poet"):
        assert cards[name]["parent"] == BUILD and cards[name]["root"] == str(paths[name])
        assert client.models.retrieve(name).model_dump() == cards[name]


def test_each_adapter_gives_its_own_greedy_answer_and_the_answer_names_it(client, served, lora_build):
    """Three different greedy answers; the base answers the same before and after the adapters ran; trtllm-serve's
    lora_request selects the same adapter as its name; the frontend's text is Triton's own for that task id."""
    from pipeline.client import format_chat, stream_generate

    _, folder, _ = lora_build
    answers = {}
    for model in (BUILD, "sql", "poet"):
        r = _chat(client, model)
        assert r.model == model and r.usage.completion_tokens > 0
        answers[model] = r.choices[0].message.content
    assert len(set(answers.values())) == 3, answers
    assert _chat(client, BUILD).choices[0].message.content == answers[BUILD]
    by_request = _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "poet", "lora_int_id": 2}})
    assert by_request.choices[0].message.content == answers["poet"] and by_request.model == BUILD
    prompt = format_chat(folder / "engine", QUESTION)
    for model, task in (("sql", 1), ("poet", 2)):
        direct = stream_generate(served[0].cfg.grpc_url, prompt, 16, extra={"lora_task_id": task}, timeout_s=120)
        assert "".join(c.text for c in direct) == answers[model]
    completion = client.completions.create(model="sql", prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
    base = client.completions.create(model=BUILD, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert completion.model == "sql" and completion.choices[0].text != base.choices[0].text


@pytest.mark.parametrize("model", [BUILD, "sql", "poet"])
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
    assert f"'{BUILD}', 'sql', 'poet'" in body["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError):
        _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "nope"}})
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, BUILD, extra_body={"lora_request": {"lora_name": "sql", "lora_int_id": 1,
                                                          "lora_path": "/somewhere/else"}})
    assert "fixed at build time" in err.value.body["message"]
    assert _chat(client, "sql").choices[0].message.content  # still serving
    text = urllib.request.urlopen(served[1].launch.url + "/metrics", timeout=10).read().decode()
    assert 'trtpipe_openai_model_requests_total{model="sql"}' in text


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
    models = ["sql", "poet", BUILD]
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
