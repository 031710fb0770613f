"""Keys against the real servers, on 127.0.0.1 only: a tritonserver started with the restriction options the
deployment files give it (their compose command, expanded by bash with a key) refuses model control without the key
and takes it with the key, over HTTP and gRPC, while inference stays open; the OpenAI frontend started with a key
answers the official ``openai`` client 401 without it and 200 with it. Neither key shows in either server's log."""

from __future__ import annotations

import json
import logging
import os
import secrets
import urllib.error
import urllib.request
from unittest import mock

import pytest

from model_repo.launch import FRONTEND_API_KEY_ENV, TRITON_ADMIN_HEADER, TRITON_ADMIN_KEY_ENV
from tests.conftest import REPO
from tests.model_repo.test_deploy_security import compose_command, expanded

pytestmark = pytest.mark.e2e

TRITON_KEY = secrets.token_hex(16)
OPENAI_KEY = secrets.token_hex(16)
FACTS = json.loads((REPO / "tests" / "facts" / "tritonserver_2_51" / "restricted_api.json").read_text())


def _deployed_restriction(built_default) -> list[str]:
    """The restriction options of the default build's docker-compose.yaml, as the container's bash expands them."""
    from builders.spec import load_spec
    from model_repo.deploy import compose, plan_deployment
    from plugins.targets import get_target
    from tests.conftest import DEFAULT_BUILD

    plan = plan_deployment(load_spec(DEFAULT_BUILD, "cpu"), get_target("cpu"), built_default)
    line = compose_command(compose(plan)["services"]["triton"])
    out = expanded(line, {"PATH": "/usr/bin:/bin", TRITON_ADMIN_KEY_ENV: TRITON_KEY})
    assert out.returncode == 0, out.stderr
    args = [a for a in out.stdout.split("\0") if "restricted" in a]
    assert len(args) == 2
    return args


@pytest.fixture(scope="module")
def restricted(built_default, tmp_path_factory):
    """tritonserver on the default build with the deployment's restriction and explicit model control (all models
    loaded at start), so that a load request is a real model-control call."""
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    said = logging.getLogger("trtpipe")  # what `trtpipe serve` logs (at INFO) while starting it
    level = said.level
    said.setLevel(logging.INFO)
    said.addHandler(_SAID)
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(model_repository=built_default / "model_repo", http_port=http, grpc_port=grpc,
                       metrics_port=metrics, log_file=tmp_path_factory.mktemp("restricted") / "tritonserver.log",
                       ready_timeout_s=300, python_path=default_sys_path(),
                       extra_args=_deployed_restriction(built_default) + ["--model-control-mode=explicit",
                                                                          "--load-model=*"])
    server = TritonServer(cfg).start()
    yield server
    server.stop()
    said.removeHandler(_SAID)
    said.setLevel(level)


class _Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


_SAID = _Said()


def _post(url: str, headers: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json", **headers},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_triton_model_control_needs_the_key_over_http(restricted):
    base = f"http://127.0.0.1:{restricted.cfg.http_port}/v2/repository"
    for headers in ({}, {TRITON_ADMIN_HEADER: "wrong"}):
        for path in ("/index", "/models/postprocessing/load"):
            status, text = _post(base + path, headers)
            assert status == FACTS["refused"]["http_status"], (path, headers, status, text)
            assert FACTS["refused"]["http_message_contains"] in text
    status, text = _post(base + "/index", {TRITON_ADMIN_HEADER: TRITON_KEY})
    assert status == 200 and {"name": "postprocessing", "state": "READY"}.items() <= \
        next(m for m in json.loads(text) if m["name"] == "postprocessing").items()
    assert _post(base + "/models/postprocessing/load", {TRITON_ADMIN_HEADER: TRITON_KEY})[0] == 200


def test_triton_model_control_needs_the_key_over_grpc_and_inference_stays_open(restricted):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(restricted.cfg.grpc_url)
    try:
        for headers in (None, {f"{FACTS['grpc_header_prefix']}{TRITON_ADMIN_HEADER}": "wrong"},
                        {TRITON_ADMIN_HEADER: TRITON_KEY}):  # the HTTP spelling is not the gRPC one
            with pytest.raises(InferenceServerException) as err:
                client.load_model("postprocessing", headers=headers)
            assert FACTS["refused"]["grpc_status"] in str(err.value.status()), err.value
        right = {f"{FACTS['grpc_header_prefix']}{TRITON_ADMIN_HEADER}": TRITON_KEY}
        client.load_model("postprocessing", headers=right)
        assert client.is_model_ready("postprocessing")
        assert {m.name for m in client.get_model_repository_index(headers=right).models} >= {"ensemble",
                                                                                              "tensorrt_llm"}
        assert client.get_model_metadata("tensorrt_llm_bls").name == "tensorrt_llm_bls"  # metadata: open
    finally:
        client.close()


@pytest.fixture(scope="module")
def keyed_frontend(restricted, built_default, tmp_path_factory):
    from builders.spec import load_spec
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports
    from tests.conftest import DEFAULT_BUILD

    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), restricted.cfg, free_ports(1)[0],
                             built_default / "engine")
    launch.log_file = tmp_path_factory.mktemp("frontend") / "openai_frontend.log"
    with mock.patch.dict(os.environ, {FRONTEND_API_KEY_ENV: OPENAI_KEY}):  # the child copies it at start
        fe = OpenAIFrontend(launch).start()
    yield fe
    fe.stop(10)


def test_the_openai_frontend_with_a_key_answers_401_without_it_and_200_with_it(keyed_frontend):
    import openai

    url = keyed_frontend.launch.url + "/v1"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for key in ("wrong", OPENAI_KEY[:-1]):
        with pytest.raises(openai.AuthenticationError) as err:
            openai.OpenAI(base_url=url, api_key=key, max_retries=0).chat.completions.create(
                model="smollm2-135m", messages=messages, max_tokens=4)
        assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    client = openai.OpenAI(base_url=url, api_key=OPENAI_KEY, max_retries=0)
    r = client.chat.completions.with_raw_response.create(model="smollm2-135m", messages=messages, max_tokens=8,
                                                          temperature=0)
    assert r.http_response.status_code == 200 and r.parse().choices[0].message.content
    with urllib.request.urlopen(keyed_frontend.launch.url + "/health", timeout=10) as h:  # probes need no key
        assert h.status == 200


def test_no_key_in_either_servers_log(restricted, keyed_frontend):
    """After every call above (refused and accepted): the logs name neither key, nor do the lines this process
    logged while starting them (the command lines, restriction options shown as ``admin-key=***``)."""
    for path in (restricted.log_path, keyed_frontend.log_path):
        text = path.read_text(errors="replace")
        assert text and TRITON_KEY not in text and OPENAI_KEY not in text, path
    started = [line for line in _SAID.lines if line.startswith("starting tritonserver")]
    assert started and "admin-key=***" in started[0]
    assert not any(TRITON_KEY in line or OPENAI_KEY in line for line in _SAID.lines)
