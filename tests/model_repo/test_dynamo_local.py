"""The generated Dynamo settings against real Dynamo 1.6.1 processes (no cluster, no GPU).

From the DynamoGraphDeployment ``trtpipe deploy --engine dynamo --disagg`` writes, this starts what its components
say: Dynamo's frontend with the component's own arguments (router mode kv), and for each worker Dynamo's mock engine
(``dynamo.mocker``, TensorRT-LLM engine type) in the worker's disaggregation mode, with the batch, token and block
limits of its options file and its container environment (status server, health that follows the generate
endpoint). Discovery is a local folder instead of Kubernetes; ports are free ones. Then the readiness probes' paths
answer 200 and ``trtpipe loadtest`` over the OpenAI endpoint completes every request, through both workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from builders.model_fetch import resolve_source
from model_repo import dynamo
from tests.conftest import REPO

pytestmark = pytest.mark.e2e
PY = REPO / ".dynamo" / "bin" / "python"
BUILD = REPO / "configs" / "builds" / "smollm2-135m.yaml"


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _wait(url: str, timeout_s: float = 90) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if _get(url) == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"{url} never answered 200")


def _low_free_ports(n: int) -> list[int]:
    """Free ports below 32768: Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit integer (a port above 32767
    makes the worker exit: "expected i16 for key SYSTEM_PORT")."""
    import random
    import socket

    out = []
    while len(out) < n:
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in out:
            out.append(port)
    return out


def _main(c):
    return next(x for x in c["podTemplate"]["spec"]["containers"] if x["name"] == "main")


@pytest.fixture
def graph(tmp_path):
    if not PY.is_file():  # a failure, never a skip: `make setup` installs it
        pytest.fail("ai-dynamo 1.6.1 is not installed in .dynamo/ (`make setup` / `scripts/setup.sh --tools` installs it: run it)")
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "deploy", str(BUILD), "--target", "h200", "--runtime",
                        "trtllm-llmapi", "--engine", "dynamo", "--disagg", "--out", str(tmp_path / "out")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    folder = next((tmp_path / "out").glob("*/*/dynamo/disagg"))
    return dynamo.documents({p.name: p.read_text() for p in folder.iterdir()})


def test_dynamo_frontend_router_and_disaggregated_workers_serve_the_load_tester(graph, tmp_path):
    model = resolve_source("embedded:smollm2-135m-instruct")
    comps = {c["type"]: c for c in graph["dgd.yaml"]["spec"]["components"]}
    configs = {k: yaml.safe_load(v) for k, v in graph["engine-configs.yaml"]["data"].items()}
    http, p_sys, d_sys = _low_free_ports(3)
    env = {**os.environ, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "discovery"),
           "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "zmq", "DYN_NAMESPACE": "trtpipe-test"}
    procs, logs = [], {}
    try:
        fe = _main(comps["frontend"])
        args = list(fe["args"])
        args[args.index("--http-port") + 1] = str(http)
        logs["frontend"] = open(tmp_path / "frontend.log", "w")
        procs.append(subprocess.Popen([str(PY), *args, "--http-host", "127.0.0.1"], env=env, stdout=logs["frontend"],
                                      stderr=subprocess.STDOUT, start_new_session=True))
        served = None
        for role, port in (("prefill", p_sys), ("decode", d_sys)):
            main = _main(comps[role])
            wargs = main["args"]
            served = wargs[wargs.index("--served-model-name") + 1]
            opts = configs[wargs[wargs.index("--extra-engine-args") + 1].rsplit("/", 1)[-1]]
            wenv = {**env, **{e["name"]: e["value"] for e in main["env"]}, "DYN_SYSTEM_PORT": str(port)}
            logs[role] = open(tmp_path / f"{role}.log", "w")
            procs.append(subprocess.Popen(
                [str(PY), "-m", "dynamo.mocker", "--model-path", str(model), "--model-name", served,
                 "--engine-type", "trtllm", "--disaggregation-mode", wargs[wargs.index("--disaggregation-mode") + 1],
                 "--max-num-seqs", str(opts["max_batch_size"]), "--max-num-batched-tokens", str(opts["max_num_tokens"]),
                 "--block-size", str(opts["kv_cache_config"]["tokens_per_block"]),
                 "--max-model-len", str(opts["max_seq_len"])],
                env=wenv, stdout=logs[role], stderr=subprocess.STDOUT, start_new_session=True))
        # the readiness probes of the generated pods, on the local ports
        _wait(f"http://127.0.0.1:{http}{fe['readinessProbe']['httpGet']['path']}")
        for role, port in (("prefill", p_sys), ("decode", d_sys)):
            _wait(f"http://127.0.0.1:{port}{_main(comps[role])['readinessProbe']['httpGet']['path']}")
        end = time.monotonic() + 60
        while time.monotonic() < end:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/models", timeout=5) as r:
                if served in [m["id"] for m in json.load(r)["data"]]:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError(f"{served} never listed by the frontend")
        lt = subprocess.run([sys.executable, "-m", "pipeline.cli", "loadtest", "run", "--url",
                             f"http://127.0.0.1:{http}/v1", "--endpoint", "openai-chat", "--model", served,
                             "--tokenizer", str(model), "--concurrency", "4", "--num-requests", "24", "--warmup", "2",
                             "--input-len", "64", "--output-len", "16", "--no-plots"],
                            cwd=tmp_path, env={**os.environ, "TRTPIPE_HOME": str(tmp_path)}, capture_output=True,
                            text=True, timeout=300)
        assert lt.returncode == 0, lt.stdout[-2000:] + lt.stderr[-2000:]
        path = next(ln.split("json: ", 1)[1] for ln in lt.stdout.splitlines() if ln.startswith("json: "))
        report = json.loads((tmp_path / path).read_text())
        req = report["points"][0]["summary"]["requests"]
        assert req["completed"] == req["sent"] == 24 and req["failed"] == 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for f in logs.values():
            f.close()
    # disaggregated: every request went through a prefill worker and a decode worker
    for role in ("prefill", "decode"):
        assert (tmp_path / f"{role}.log").read_text().count("request received") >= 24, role
    # the frontend routed with the KV router the component's --router-mode asked for
    text = re.sub(r"\x1b\[[0-9;]*m", "", (tmp_path / "frontend.log").read_text())
    assert re.search(r'Selected worker router_mode="kv"', text), text[-2000:]
