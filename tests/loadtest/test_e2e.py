"""End to end against the real tritonserver: the trivial-stream repository (the ``trivial`` fixture),
and the SmolLM2 build (needs the ``built_default`` fixture): marked e2e. One test checks the arguments refused
before any server is reached."""

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.loadtest.api import LoadTestError, run_loadtest
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.report import compare, load, write_reports
from pipeline.loadtest.selfcheck import selfcheck
from pipeline.serve import free_ports

PLOTS = ("throughput_latency.png", "ttft_itl.png", "tokens_over_time.png")


def _complete(out: Path, n_points: int) -> dict:
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["points"]) == n_points
    for p in PLOTS:
        assert (out / p).stat().st_size > 1000
    assert len((out / "summary.csv").read_text().splitlines()) == n_points + 1
    for p in rep["points"]:
        s = p["summary"]
        assert s["requests"]["failed"] == 0
        assert s["achieved_lengths"]["exact_fraction"] == 1.0  # trivial model: exactly max_tokens each
        assert s["ttft_s"]["n"] == s["requests"]["completed"] and s["server_side"]["ttft_s"]["n"] > 0
        assert all(r["server"] for r in p["requests"] if not r["warmup"])
        assert p["server_metrics"]["counter_deltas"]  # Triton's nv_inference_* moved
    return rep


@pytest.mark.e2e
def test_closed_loop_sweep_report(trivial, tmp_path):
    url, metrics = trivial
    cfg = LoadTestConfig(url=url, metrics_url=metrics, mode="closed", concurrency=[1, 4], num_requests=12,
                         input_len="8", output_len="uniform:2:6", warmup=1)
    rep = run_loadtest(cfg)
    write_reports(rep, tmp_path)
    rep = _complete(tmp_path, 2)
    toks = [r["output_tokens"] for r in rep["points"][1]["requests"] if not r["warmup"]]
    assert toks == [r["requested_tokens"] for r in rep["points"][1]["requests"] if not r["warmup"]]
    for p in rep["points"]:  # the server's counters cover the 12 measured requests, not the warm-up one
        assert p["server_metrics"]["counter_deltas"]["nv_inference_request_success{model=ensemble}"] == 12
        warm = [r for r in p["requests"] if r["warmup"]]  # before the measured run's t0, by seconds not hours
        assert len(warm) == 1 and -60 < warm[0]["scheduled"] <= warm[0]["sent"] < warm[0]["done"] <= 0.5, warm


@pytest.mark.e2e
def test_server_counters_leave_out_warmup_with_client_processes(trivial):
    """Two client processes, each with a warm-up request: the snapshot is taken when both are warm."""
    url, metrics = trivial
    cfg = LoadTestConfig(url=url, metrics_url=metrics, mode="closed", concurrency=[4], num_requests=8,
                         input_len="8", output_len="3", warmup=2, client_procs=2)
    rep = run_loadtest(cfg)
    p = rep["points"][0]
    assert sum(r["warmup"] for r in p["requests"]) == 2
    assert p["server_metrics"]["counter_deltas"]["nv_inference_request_success{model=ensemble}"] == 8


@pytest.mark.e2e
def test_open_loop_cli_and_compare(trivial, tmp_path, capsys):
    url, metrics = trivial
    args = ["loadtest", "run", "--url", url, "--metrics-url", metrics, "--rate", "10,20", "--burstiness", "0.5",
            "--num-requests", "12", "--output-len", "4", "--input-len", "8", "--slo-ttft-ms", "500"]
    assert main(args + ["-o", str(tmp_path / "a")]) == 0
    rep = _complete(tmp_path / "a", 2)
    assert rep["points"][0]["summary"]["schedule_lag_s"]["n"] == 12
    assert rep["verdict"]["passed"]
    assert main(args + ["-o", str(tmp_path / "b"), "--ignore-eos"]) == 0
    assert load(tmp_path / "b" / "report.json")["request_inputs"]["end_id"] > 0
    capsys.readouterr()
    assert main(["loadtest", "compare", str(tmp_path / "a" / "report.json"), str(tmp_path / "b" / "report.json")]) == 0
    assert "TTFT p50" in capsys.readouterr().out


@pytest.mark.e2e
def test_slo_miss_exits_1(trivial, tmp_path):
    url, _ = trivial
    assert main(["loadtest", "run", "--url", url, "--concurrency", "2", "--num-requests", "4", "--output-len", "3",
                 "--slo-e2e-ms", "0.001", "--no-plots", "-o", str(tmp_path)]) == 1


@pytest.mark.e2e
def test_selfcheck_reports_a_ceiling(trivial):
    """The ceiling is the highest rate of the escalation that kept up, which stops at the first rate that did
    not: 10^5 req/s (400 requests due within 4 ms) cannot be kept up by any client, so 20 req/s is never tried.
    Whether 10 req/s keeps up depends on the machine, so it is not asserted: the ceiling must follow from it."""
    url, metrics = trivial
    res = selfcheck([10.0, 1e5, 20.0], output_len=4, seconds_per_rate=1.0, url=url, metrics_url=metrics,
                    min_requests=10, max_requests=400)
    rows = res["rows"]
    assert [r["rate"] for r in rows] == ([10.0, 1e5] if rows[0]["kept_up"] else [10.0]), rows
    assert [r["requests"] for r in rows] == [10, 400][:len(rows)]
    assert not rows[-1]["kept_up"] and all(r["kept_up"] for r in rows[:-1])
    assert res["ceiling_rps"] == (10.0 if rows[0]["kept_up"] else None), res
    assert rows[0]["failed"] == 0, rows[0]  # no request failed at 10 req/s, kept up or not


@pytest.mark.e2e
def test_client_bound_run_is_marked_invalid(trivial, tmp_path):
    url, _ = trivial
    cfg = LoadTestConfig(url=url, mode="open", rate=[50.0], num_requests=10, output_len="2", input_len="4",
                         ceiling_rps=5.0)
    rep = run_loadtest(cfg)
    assert rep["verdict"]["invalid_points"] == [0]
    assert "ceiling" in rep["points"][0]["validity"]["reasons"][0]


@pytest.mark.e2e
def test_a_model_the_server_lacks_is_refused(trivial):
    url, _ = trivial
    with pytest.raises(LoadTestError, match="not in the server's repository"):
        run_loadtest(LoadTestConfig(url=url, model="nope"))


def test_bad_arguments_and_no_server_give_clear_errors(capsys):
    """No server needed: arguments are checked first, and a URL nothing listens on is named."""
    url = f"127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(LoadTestError, match="fixed_output"):
        run_loadtest(LoadTestConfig(url=url, fixed_output="bogus"))
    with pytest.raises(LoadTestError, match="cannot reach Triton"):
        run_loadtest(LoadTestConfig(url=url))
    assert main(["loadtest", "run", "--url", url, "--rate", "-3"]) == 2
    assert "rate" in capsys.readouterr().err


@pytest.mark.e2e
def test_smollm2_closed_and_open(request, tmp_path):
    """The closed loop on a server ``loadtest run --model-repo`` starts and stops itself; the open loop on the
    session's server of the same repository (``--url``: the repository still gives the tokenizer and manifest)."""
    try:
        built = request.getfixturevalue("built_default")
        server = request.getfixturevalue("default_server")
    except pytest.FixtureLookupError:
        pytest.skip("needs the built_default and default_server fixtures (tests/conftest.py) with the SmolLM2 build")
    build_dir = Path(getattr(built, "build_dir", built))
    repo = build_dir / "model_repo" if (build_dir / "model_repo").is_dir() else build_dir
    running = ["--url", server.cfg.grpc_url, "--metrics-url", f"http://127.0.0.1:{server.cfg.metrics_port}/metrics"]
    for shape in (["--concurrency", "2"], ["--rate", "1", *running]):
        out = tmp_path / shape[0].strip("-")
        assert main(["loadtest", "run", "--model-repo", str(repo), *shape, "--num-requests", "4", "--warmup", "1",
                     "--input-len", "16", "--output-len", "8", "--ignore-eos", "--allow-invalid",
                     "-o", str(out)]) == 0
        rep = json.loads((out / "report.json").read_text())
        s = rep["points"][0]["summary"]
        assert s["requests"]["completed"] == 4 and s["achieved_lengths"]["exact_fraction"] == 1.0
        assert rep["manifest"] is not None and all((out / p).is_file() for p in PLOTS)
