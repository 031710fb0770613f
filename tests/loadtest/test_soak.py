"""The overload soak, short: the default build served by the real tritonserver, an open loop far past what its
admission limit and fixed-length answers let any machine absorb, for 3 s (the 30-minute run at a multiple of
the measured capacity is scripts/bench/bench_soak.py, figures in docs/benchmarks/reliability.md). Every request
completes or is refused at once as overloaded (serving.max_queue_size), none times out or is lost, no process
grows, and the KV cache drains.

The overload does not depend on the machine's speed (a rate derived from a capacity measured on a busy machine
was no overload at all): the server holds at most max_batch_size + max_queue_size requests, and each admitted one
leaves only after OUTPUT_TOKENS decode steps (ignore_eos), so while RATE * SEND_S requests arrive it can finish
at most max_batch_size * SEND_S / (OUTPUT_TOKENS * step) of them. With the default build's 8 + 16 that refuses
requests unless one decode step of a batch of 8 takes under 8 * 3 / (32 * (300 - 24)) s = 2.7 ms; it takes
about 0.2 s on a busy 2-core machine. A slow machine only makes the test longer: the timeouts are generous.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 100.0
"""Requests/s, evenly spaced (burstiness 1000: every gap within a few percent of 1 / RATE)."""
SEND_S = 3.0
"""Seconds of sending, the same on every machine (the RSS samples after WARMUP_S fall in it)."""
WARMUP_S = 2.0
OUTPUT_TOKENS = 32
"""Every answer exactly this long (ignore_eos): an admitted request holds its slot for this many decode steps."""
ADMISSION_REFUSALS = ("serving.max_queue_size", "Exceeds maximum queue size")
"""Words of the two refusals serving.max_queue_size sets: the runtime's, Triton's queue policy's."""


def test_an_overload_past_the_admission_limit_completes_or_refuses_every_request(default_server, built_default):
    from builders.admission import admission_plan
    from pipeline.loadtest.config import LoadTestConfig
    from pipeline.loadtest.soak import judge, measure_capacity, run_soak

    settings = json.loads((built_default / "manifest.json").read_text())["settings"]
    adm = admission_plan(settings["limits"]["max_batch_size"], settings["serving"]["max_queue_size"])
    assert adm.capacity, adm.text()
    # the load is absorbed, nothing refused, only if one decode step of a full batch is faster than this
    absorbing_step_s = adm.in_flight * SEND_S / (OUTPUT_TOKENS * (RATE * SEND_S - adm.capacity))
    assert 0 < absorbing_step_s < 0.005, f"no overload on a fast machine: {absorbing_step_s=}, {adm.text()}"

    def cfg():
        return LoadTestConfig(url=default_server.cfg.grpc_url, tokenizer_dir=built_default / "engine",
                              metrics_url=f"http://127.0.0.1:{default_server.cfg.metrics_port}/metrics",
                              input_len="32", output_len=str(OUTPUT_TOKENS), fixed_output="ignore_eos",
                              burstiness=1000.0, warmup=0, request_timeout_s=300.0, drain_timeout_s=300.0,
                              perf_metrics=False)

    # One full batch before the soak, outside its RSS watch: a fresh tritonserver grows a few percent over its
    # first streams, once (its rate is not used; the soak's own warm-up requests would go one at a time inside
    # the watch and move the sending past WARMUP_S on a slow machine).
    measure_capacity(cfg(), concurrency=adm.in_flight, num_requests=adm.in_flight)
    res = run_soak(cfg(), rate=RATE, duration_s=SEND_S, server_pid=default_server.proc.pid, warmup_s=WARMUP_S,
                   sample_s=0.5)
    v = res["verdict"]
    assert v["passed"], v["reasons"]
    assert set(v["by_outcome"]) <= {"completed", "overloaded"}, v["by_outcome"]
    # the overload happened and was answered by the admission limit, not by waiting: the runtime's refusal names
    # serving.max_queue_size; Triton's queue policy on the tensorrt_llm model, set from the same serving.max_queue_size
    # (config.pbtxt default_queue_policy), refuses first while that model's stub is behind (a loaded machine)
    assert v["by_outcome"].get("overloaded", 0) > 0, v["by_outcome"]
    refused = [r for r in res["requests"] if r.get("error_kind") == "overloaded"]
    other = [r["error"] for r in refused if not any(w in r["error"] for w in ADMISSION_REFUSALS)]
    assert not other, f"{len(other)} of {len(refused)} refused by something else, first: {other[:3]}"
    assert max(r["done"] - r["sent"] for r in refused) < 5.0, "a refusal should be immediate"
    assert res["drain"]["kv_free"] == res["drain"]["kv_total"]
    assert any("engine_worker.py" in k for k in res["rss"]), sorted(res["rss"])
    # the verdict is not a constant: the same result with a request lost to a timeout fails
    lost = dict(res, requests=res["requests"] + [{"error_kind": "timeout", "warmup": False}])
    assert not judge(lost)["passed"]
