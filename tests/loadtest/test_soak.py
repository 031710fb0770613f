"""The overload soak, short: the default build served by the real tritonserver, an open loop at twice its
measured capacity for 60 s (the 30-minute run is scripts/bench/bench_soak.py, figures in
docs/benchmarks/reliability.md). Every request completes or is refused at once as overloaded
(serving.max_queue_size), none times out or is lost, no process grows, and the KV cache drains."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_twice_the_capacity_completes_or_refuses_every_request(default_server, built_default):
    from pipeline.loadtest.config import LoadTestConfig
    from pipeline.loadtest.soak import judge, measure_capacity, run_soak

    def cfg():
        return LoadTestConfig(url=default_server.cfg.grpc_url, tokenizer_dir=built_default / "engine",
                              metrics_url=f"http://127.0.0.1:{default_server.cfg.metrics_port}/metrics",
                              request_timeout_s=120.0, perf_metrics=False)

    cap = measure_capacity(cfg(), concurrency=8, num_requests=16)
    assert cap["rps"] and cap["rps"] > 0, cap["summary"]["requests"]
    res = run_soak(cfg(), rate=2 * cap["rps"], duration_s=60.0, server_pid=default_server.proc.pid, warmup_s=15.0,
                   sample_s=2.0)
    v = res["verdict"]
    assert v["passed"], v["reasons"]
    assert set(v["by_outcome"]) <= {"completed", "overloaded"}, v["by_outcome"]
    # the overload happened and was answered by the runtime's admission limit, not by waiting
    assert v["by_outcome"].get("overloaded", 0) > 0, v["by_outcome"]
    refused = [r for r in res["requests"] if r.get("error_kind") == "overloaded"]
    assert all("serving.max_queue_size" in r["error"] for r in refused), refused[0]["error"]
    assert max(r["done"] - r["sent"] for r in refused) < 5.0, "a refusal should be immediate"
    assert res["drain"]["kv_free"] == res["drain"]["kv_total"]
    assert any("engine_worker.py" in k for k in res["rss"]), sorted(res["rss"])
    # the verdict is not a constant: the same result with a request lost to a timeout fails
    lost = dict(res, requests=res["requests"] + [{"error_kind": "timeout", "warmup": False}])
    assert not judge(lost)["passed"]
