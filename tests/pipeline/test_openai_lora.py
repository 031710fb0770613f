"""The OpenAI frontend's LoRA adapters without a server: which ``lora_task_id`` a request's ``model`` or
``lora_request`` selects (pipeline.openai_requests.lora_task_id, prepare), the tensor it becomes, the 404 for a model
not served, ``/v1/models`` as vLLM lists adapters (the real application on uvicorn, SmolLM2's real tokenizer: every
answer here comes before a request would reach Triton), and the command line that carries the adapters from the
build's plan.json to the frontend (``trtpipe serve`` and the deployment files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.openai_frontend import EXIT_REFUSED, FrontendConfig, build_parser, create_app, main
from pipeline.openai_requests import APIError, ChatBody, lora_task_id, prepare
from tests.conftest import smollm2_tokenizer_dir

BASE = "smollm2-135m"
ADAPTERS = {"sql": 1, "poet": 2}
PATHS = {"sql": "/adapters/sql", "poet": "/adapters/poet"}


def _cfg(**kw) -> FrontendConfig:
    return FrontendConfig("127.0.0.1:1", BASE, smollm2_tokenizer_dir(), 256, 512,
                          adapters=kw.pop("adapters", ADAPTERS), adapter_paths=kw.pop("adapter_paths", PATHS), **kw)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()), local_files_only=True)


# ---- model -> lora_task_id ------------------------------------------------------------------------------------

def test_the_base_model_sends_no_task_id_and_an_adapter_its_own():
    cfg = _cfg()
    assert lora_task_id(cfg, BASE) is None
    assert lora_task_id(cfg, "sql") == 1 and lora_task_id(cfg, "poet") == 2
    assert cfg.served == [BASE, "sql", "poet"]


def test_a_model_neither_base_nor_adapter_is_a_404_naming_the_served_ids():
    with pytest.raises(APIError) as err:
        lora_task_id(_cfg(), "gpt-4o")
    e = err.value
    assert (e.status, e.type, e.param, e.code) == (404, "invalid_request_error", "model", "model_not_found")
    assert e.message == "model 'gpt-4o' not found: this server serves 'smollm2-135m', 'sql', 'poet'"
    with pytest.raises(APIError) as err:  # without adapters, the message the frontend always gave
        lora_task_id(_cfg(adapters={}, adapter_paths={}), "gpt-4o")
    assert err.value.message == "model 'gpt-4o' not found: this server serves 'smollm2-135m'"


@pytest.mark.parametrize("model, request_, want", [
    (BASE, {"lora_name": "poet"}, 2),
    (BASE, {"lora_int_id": 1}, 1),
    (BASE, {"lora_name": "sql", "lora_int_id": 1, "lora_path": "/adapters/sql"}, 1),
    (BASE, {"lora_name": "sql", "lora_path": "/adapters/sql/"}, 1),  # a trailing slash is the same folder
    ("poet", {"lora_name": "poet"}, 2),
])
def test_trtllm_serves_lora_request_names_a_served_adapter(model, request_, want):
    assert lora_task_id(_cfg(), model, request_) == want


@pytest.mark.parametrize("request_, status, words", [
    ({"lora_name": "nope"}, 404, "lora_name 'nope' is not an adapter this server serves"),
    ({"lora_int_id": 7}, 404, "lora_int_id 7 is not an adapter"),
    ({"lora_name": "sql", "lora_int_id": 2}, 400, "is lora_int_id 1 here, not 2"),
    ({"lora_name": "sql", "lora_path": "/elsewhere/sql"}, 400, "adapters are fixed at build time"),
    ({"lora_path": "/adapters/sql"}, 400, "name the adapter by lora_name or lora_int_id"),
    ({"lora_int_id": "1"}, 400, "an integer expected"),
    ("sql", 400, "an object of lora_name, lora_int_id and lora_path expected"),
])
def test_a_lora_request_that_names_no_served_adapter_is_refused(request_, status, words):
    with pytest.raises(APIError) as err:
        lora_task_id(_cfg(), BASE, request_)
    assert err.value.status == status and words in err.value.message and err.value.param == "lora_request"
    if status == 404:  # the adapters served, with their ids
        assert err.value.code == "model_not_found" and "'sql' (lora_int_id 1), 'poet' (lora_int_id 2)" in \
            err.value.message


def test_a_lora_request_for_another_adapter_than_model_is_refused():
    with pytest.raises(APIError) as err:
        lora_task_id(_cfg(), "sql", {"lora_name": "poet"})
    assert err.value.status == 400 and "'sql' and lora_request's adapter 'poet' differ" in err.value.message


def test_prepare_puts_the_task_id_among_the_triton_inputs_only_for_an_adapter(tok):
    cfg = _cfg()
    messages = [{"role": "user", "content": "Grüße, 世界 🌍"}]
    for model, extra, want in ((BASE, {}, None), ("poet", {}, 2), (BASE, {"lora_request": {"lora_int_id": 1}}, 1)):
        body = ChatBody.model_validate({"model": model, "messages": messages, "max_tokens": 4, **extra})
        asked = prepare(cfg, tok, body, "hello", True)
        assert asked.extra.get("lora_task_id") == want
        assert ("lora_task_id" in asked.extra) is (want is not None)


def test_the_task_id_is_sent_as_the_contracts_uint64_of_shape_1_1():
    """Every runtime's models declare lora_task_id UINT64 dims [1] (upstream's name), batch dimension first."""
    from pipeline.client import build_inputs

    ins = {i.name(): i for i in build_inputs("hi", 4, extra={"lora_task_id": 2, "seed": 3, "top_k": 5})}
    assert ins["lora_task_id"].datatype() == "UINT64" and ins["lora_task_id"].shape() == [1, 1]
    assert np.frombuffer(ins["lora_task_id"]._get_content(), dtype="<u8").tolist() == [2]
    assert ins["top_k"].datatype() == "INT32"


# ---- /v1/models, 404 bodies and answers on the real application ------------------------------------------------

@pytest.fixture(scope="module")
def served():
    from tests.pipeline.test_openai_security import _Served

    with _Served(create_app(_cfg())) as c:
        yield c


def test_v1_models_lists_the_base_and_each_adapter_as_vllm_does(served):
    status, _, text = served.get("/v1/models")
    body = json.loads(text)
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["root"], m["parent"]) for m in body["data"]] == [
        (BASE, BASE, None), ("sql", "/adapters/sql", BASE), ("poet", "/adapters/poet", BASE)]
    assert all(m["object"] == "model" and m["owned_by"] == "trtpipe" and isinstance(m["created"], int)
               for m in body["data"])
    status, _, text = served.get("/v1/models/poet")
    assert status == 200 and json.loads(text) == body["data"][2]
    assert json.loads(served.get(f"/v1/models/{BASE}")[2]) == body["data"][0]


def test_an_unknown_model_is_openais_404_on_every_route(served):
    status, _, text = served.get("/v1/models/other")
    assert status == 404 and json.loads(text) == {"error": {
        "message": "model 'other' not found: this server serves 'smollm2-135m', 'sql', 'poet'",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        status, _, text = served.post(path, {"model": "other", **body})
        assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found"
        status, _, text = served.post(path, {"model": BASE, "lora_request": {"lora_name": "nope"}, **body})
        assert status == 404 and json.loads(text)["error"]["param"] == "lora_request"
        status, _, text = served.post(path, {"model": BASE, "lora_request": {"lora_name": "sql",
                                                                             "lora_path": "/tmp/mine"}, **body})
        assert status == 400 and "fixed at build time" in json.loads(text)["error"]["message"]


# ---- the command line ---------------------------------------------------------------------------------------------

def _argv(*more: str) -> list[str]:
    return ["--grpc-url", "127.0.0.1:1", "--model", BASE, "--tokenizer", "/nonexistent", "--max-input-len", "8",
            "--max-seq-len", "16", *more]


def test_the_lora_options_parse_into_the_adapters():
    from pipeline.openai_frontend import adapters_of

    args = build_parser().parse_args(_argv("--lora", "sql=1", "--lora", "poet=2", "--lora-path", "sql=/a/b=c"))
    assert adapters_of(args) == ({"sql": 1, "poet": 2}, {"sql": "/a/b=c"})
    for bad in (["--lora", "sql"], ["--lora", "sql=0"], ["--lora", "sql=x"], ["--lora", "=1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(_argv(*bad))


@pytest.mark.parametrize("more, words", [
    (["--lora", "sql=1", "--lora", "sql=2"], "given twice"),
    (["--lora", "sql=1", "--lora", "poet=1"], "task id 1 is already adapter 'sql'"),
    (["--lora", f"{BASE}=1"], "is the base model's id"),
    (["--lora-path", "sql=/x"], "no --lora sql=TASK_ID"),
])
def test_adapters_that_cannot_be_served_stop_the_frontend_before_it_starts(more, words, capsys):
    assert main(_argv(*more)) == EXIT_REFUSED
    assert words in capsys.readouterr().err


def test_frontend_argv_writes_each_adapter_and_the_parser_reads_them_back():
    from model_repo.launch import frontend_argv

    argv = frontend_argv("python3", grpc_url="127.0.0.1:8001", model=BASE, tokenizer="/t", max_input_len=8,
                         max_seq_len=16, add_special_tokens=False, host="127.0.0.1", port=9000,
                         adapters={"poet": 2, "sql": 1}, adapter_paths=PATHS)
    assert argv[argv.index("--lora"):] == ["--lora", "sql=1", "--lora", "poet=2", "--lora-path", "sql=/adapters/sql",
                                           "--lora-path", "poet=/adapters/poet"]
    args = build_parser().parse_args(argv[3:])
    assert dict(args.lora) == ADAPTERS and dict(args.lora_path) == PATHS
    plain = frontend_argv("python3", grpc_url="g", model=BASE, tokenizer="/t", max_input_len=8, max_seq_len=16,
                          add_special_tokens=False, host="h", port=1)
    assert "--lora" not in plain and build_parser().parse_args(plain[3:]).lora == []


def _lora_build(tmp_path):
    """A build file with two adapters (folders named, not read: nothing here plans the build) and its folder's
    plan.json ``lora`` as builders.plan writes it."""
    from builders.spec import load_spec
    from tests.conftest import DEFAULT_BUILD

    spec = tmp_path / "lora.yaml"
    spec.write_text(Path(DEFAULT_BUILD).read_text() + "\nlora:\n  adapters:\n    sql: adapters/sql\n    poet: adapters/poet\n")
    build = load_spec(spec, "cpu")
    folder = tmp_path / "out"
    folder.mkdir()
    adapters = [{"name": n, "task_id": t, "path": str(tmp_path / "adapters" / n), "rank": 4} for n, t in
                ADAPTERS.items()]
    (folder / "plan.json").write_text(json.dumps({"name": build.name, "lora": {"adapters": adapters}}))
    return build, folder


def test_serve_and_the_deployment_files_pass_the_plans_adapters(tmp_path):
    """``trtpipe serve``'s launch and the compose / Kubernetes command both carry plan.json's adapters."""
    from model_repo.deploy import plan_deployment
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import ServerConfig
    from plugins.targets import get_target

    build, folder = _lora_build(tmp_path)
    launch = frontend_launch(build, ServerConfig(model_repository=folder / "model_repo"), 9000, folder / "engine")
    assert launch.adapters == ADAPTERS and launch.adapter_paths["poet"] == str(tmp_path / "adapters" / "poet")
    for argv in (launch.argv(), plan_deployment(build, get_target("cpu"), folder).openai):
        args = build_parser().parse_args(argv[3:])
        assert dict(args.lora) == ADAPTERS and dict(args.lora_path)["sql"] == str(tmp_path / "adapters" / "sql")


def test_a_plan_json_that_lists_other_adapters_than_the_build_file_is_refused(tmp_path):
    from model_repo.deploy import served_adapters
    from plugins.errors import PipelineError

    build, folder = _lora_build(tmp_path)
    (folder / "plan.json").write_text(json.dumps({"lora": None}))
    with pytest.raises(PipelineError, match="rebuild"):
        served_adapters(build, folder)


def test_trtpipe_query_model_sends_the_adapters_task_id(tmp_path):
    from pipeline.cli import _query_task_id
    from plugins.errors import PipelineError

    build, folder = _lora_build(tmp_path)
    assert _query_task_id(build, folder, None) == 0 and _query_task_id(build, folder, BASE) == 0
    assert _query_task_id(build, folder, "poet") == 2
    with pytest.raises(PipelineError, match="neither the base model .smollm2-135m. nor one of its LoRA adapters "
                                            r"\(sql, poet\)"):
        _query_task_id(build, folder, "nope")
