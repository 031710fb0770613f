"""What the load tester does when the server goes away or cannot keep up, with bad dataset lines, and which
tokenizer counts tokens with --url: against real local servers (tests/loadtest/fake_servers.py), and a real
tritonserver (the trivial-stream repository) for a server killed mid-stream."""

import asyncio
import contextlib
import json
import logging
import os
import signal
import time

import pytest

from pipeline.cli import DEFAULT_BUILD, main
from pipeline.loadtest.api import run_loadtest, validity
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.workload import WordTokenizer, from_jsonl
from pipeline.serve import free_ports
from plugins.errors import SpecError
from tests.loadtest.fake_servers import OpenAIStub


def _openai_args(url, out, *extra):
    return ["loadtest", "run", "--url", url, "--endpoint", "openai-completions", "--warmup", "0", "--input-len", "4",
            "--output-len", "3", "--no-plots", "-o", str(out / "report"), "--out", str(out / "builds"), *extra]


@pytest.mark.parametrize("then", ["close", "cut", "refuse"])
def test_a_server_that_goes_away_makes_the_point_invalid_and_the_run_fail(then, tmp_path):
    """After 3 answers the server closes connections unanswered, cuts its stream before [DONE], or stops
    listening: those requests are connection errors, the point is invalid, the command exits 3."""
    with OpenAIStub(good=3, then=then, service_s=0.1) as srv:
        rc = main(_openai_args(srv.url, tmp_path, "--concurrency", "1", "--num-requests", "6"))
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    p = rep["points"][0]
    assert p["summary"]["requests"]["completed"] == 3
    assert p["summary"]["requests"]["errors_by_kind"] == {"connection": 3}
    assert "server unreachable: 3 of 6 requests failed with connection errors" in " ".join(p["validity"]["reasons"])
    assert not p["validity"]["valid"] and not rep["verdict"]["passed"] and rc == 3
    if then == "cut":
        assert all("before data: [DONE]" in r["error"] for r in p["requests"] if r["error"])


@contextlib.contextmanager
def _trivial_tritonserver(tmp_path, token_delay_us: int):
    """A real tritonserver on the trivial-stream repository (model ``ensemble``); yields the TritonServer."""
    from model_repo.generate import default_sys_path
    from model_repo.trivial import write_trivial_repository
    from pipeline.serve import ServerConfig, TritonServer

    repo = write_trivial_repository(tmp_path / "model_repo", token_delay_us=token_delay_us)
    http, grpc, metrics = free_ports(3)
    srv = TritonServer(ServerConfig(repo, http, grpc, metrics, python_path=default_sys_path(),
                                    log_file=tmp_path / "tritonserver.log", ready_timeout_s=120)).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.e2e
def test_requests_on_a_killed_triton_fail_at_once_as_connection_errors(tmp_path, monkeypatch):
    """kill -9 of a real tritonserver while it streams the 3rd of 8 requests (its first token came): that one and
    the 5 after it fail with the connection kind, the 5 at once (failed before they were sent, not after the
    request timeout each), and the point is invalid. request_timeout_s is a hang guard only: no speed is
    asserted."""
    from pipeline.loadtest import runner

    sends, killed = [], []
    send = runner.Connection.send

    async def send_and_kill_on_the_third(self, rec, req, timeout_s):
        sends.append(rec)
        if len(sends) != 3:
            return await send(self, rec, req, timeout_s)
        task = asyncio.ensure_future(send(self, rec, req, timeout_s))
        deadline = time.monotonic() + 60  # hang guard: the server streams a token every 0.3 s
        while not rec.response_times and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert rec.response_times and not task.done(), "the 3rd request was not streaming when the kill was due"
        os.kill(srv.proc.pid, signal.SIGKILL)
        killed.append(srv.proc.pid)
        return await task

    monkeypatch.setattr(runner.Connection, "send", send_and_kill_on_the_third)
    with _trivial_tritonserver(tmp_path, token_delay_us=300_000) as srv:
        cfg = LoadTestConfig(url=srv.cfg.grpc_url, mode="closed", concurrency=[1], num_requests=8, warmup=0,
                             input_len="4", output_len="2", request_timeout_s=20.0, drain_timeout_s=20.0)
        rep = run_loadtest(cfg)
        assert killed and srv.proc.wait(30) == -signal.SIGKILL  # the real server died of the kill
    p = rep["points"][0]
    assert p["summary"]["requests"]["completed"] == 2
    assert p["summary"]["requests"]["errors_by_kind"] == {"connection": 6}, [r["error"] for r in p["requests"]]
    errors = [r["error"] for r in p["requests"] if r["error"]]
    assert len(errors) == 6 and errors[0].startswith("stream failed:"), errors  # the one in flight at the kill
    assert all(e.endswith("(before this request was sent)") for e in errors[1:]), errors  # at once: never sent
    assert "server unreachable: 6 of 8 requests" in p["validity"]["reasons"][0]
    assert rep["verdict"]["invalid_points"] == [0] and not rep["verdict"]["passed"]


def test_open_loop_far_above_capacity_is_overloaded():
    """A server that serves one request per 50 ms (20 req/s) offered 400 req/s: invalid, overloaded; the same
    server at 4 req/s, and closed loop, are not."""
    with OpenAIStub(service_s=0.05) as srv:
        base = dict(url=srv.url, endpoint="openai-completions", warmup=0, input_len="4", output_len="2",
                    max_schedule_lag_s=1.0)  # the server's side is under test, on a machine shared with others
        over = run_loadtest(LoadTestConfig(mode="open", rate=[400.0], num_requests=16, **base))["points"][0]
        fine = run_loadtest(LoadTestConfig(mode="open", rate=[4.0], num_requests=6, **base))["points"][0]
        closed = run_loadtest(LoadTestConfig(mode="closed", concurrency=[8], num_requests=16, **base))["points"][0]
    assert over["summary"]["requests"]["completed"] == 16  # every request answered, just far too slowly
    reason = " ".join(over["validity"]["reasons"])
    assert "overloaded: offered 400 req/s, completed" in reason and not over["validity"]["valid"]
    assert fine["validity"]["valid"], fine["validity"]["reasons"]
    assert closed["validity"]["valid"], closed["validity"]["reasons"]


@pytest.mark.parametrize("completed_rps,overloaded", [(4.9, True), (5.1, False)])
def test_overload_threshold_is_half_the_scheduled_rate(completed_rps, overloaded):
    """11 requests scheduled over 1 s send at 10 req/s: completing under 5 req/s is overloaded (open loop only)."""
    cfg = LoadTestConfig(mode="open")
    summary = {"requests": {"measured": 11, "sent": 11, "completed": 11, "errors_by_kind": {}},
               "schedule_span_s": 1.0, "request_throughput": completed_rps}
    v = validity(cfg, {"mode": "open", "rate": 10.0}, summary, [{"cpu_util": 0.1}])
    assert (not v["valid"]) == overloaded
    assert any(r.startswith("overloaded: offered 10 req/s, completed 4.90 req/s") for r in v["reasons"]) == overloaded
    assert validity(cfg, {"mode": "closed", "concurrency": 4}, summary, [{"cpu_util": 0.1}])["valid"]


BAD_LINES = [
    ('{"prompt": "fine", "output_len": 4}', None),
    ('[1, 2]', ("line 2", "not an object")),
    ('"just text"', ("line 3", "not an object")),
    ('{"prompt": "x", "output_len": -3}', ("output_len (line 4)", ">= 1")),
    ('{"prompt": "x", "max_tokens": 2.5}', ("max_tokens (line 5)", "whole number")),
    ('{"prompt": "x", "output_len": true}', ("output_len (line 6)", "whole number")),
    ('{"prompt": "x", "output_len": "12"}', ("output_len (line 7)", "whole number")),
    ('{"prompt": "x", "output_len": 0}', ("output_len (line 8)", ">= 1")),
    ('{"prompt": 7}', ("prompt (line 9)", "must be a string")),
    ('{"prompt": "unclosed"', ("line 10", "not JSON")),
]


def _bad_dataset(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(line for line, _ in BAD_LINES) + "\n")
    return p


def test_every_bad_dataset_line_is_reported_with_field_value_rule_and_fix(tmp_path):
    with pytest.raises(SpecError) as err:
        from_jsonl(_bad_dataset(tmp_path), 4, "8", WordTokenizer())
    assert err.value.fields() == [want[0] for _, want in BAD_LINES if want]
    for problem, (_, rule) in zip(err.value.problems, [want for _, want in BAD_LINES if want]):
        assert rule in problem.rule and problem.fix
    text = str(err.value)
    assert "output_len (line 4) = -3" in text and "output_len (line 6) = True" in text and "Fix:" in text


def test_a_bad_dataset_is_refused_before_any_server_is_started_or_asked(tmp_path, monkeypatch, capsys):
    """--model-repo would start tritonserver; the dataset is judged first (a tritonserver path that does not exist
    makes sure that nothing starts if it were not)."""
    monkeypatch.setenv("TRTPIPE_TRITONSERVER", str(tmp_path / "no-tritonserver"))
    repo = tmp_path / "model_repo"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\n')
    bad = _bad_dataset(tmp_path)
    assert main(["loadtest", "run", "--model-repo", str(repo), "--dataset", str(bad), "--no-plots",
                 "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "9 problems in the dataset" in err and "line 2" in err and "tritonserver" not in err
    with pytest.raises(SpecError, match="line 10"):  # the API too: before it asks the server anything
        run_loadtest(LoadTestConfig(url=f"127.0.0.1:{free_ports(1)[0]}", dataset=bad))


def _char_tokenizer(folder):
    """A real tokenizer folder (tokenizer.json + tokenizer_config.json): one token per letter."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)


def test_url_runs_count_tokens_with_the_builds_tokenizer(tmp_path, capsys, caplog):
    """--url with the (default) build: its engine/ tokenizer counts input tokens and the output names it; without
    one, words, with a warning."""
    from builders.layout import build_dir, resolve_build

    engine = build_dir(resolve_build(DEFAULT_BUILD, "cpu"), tmp_path / "builds") / "engine"
    _char_tokenizer(engine)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "hello there"}) + "\n")
    args = ["--concurrency", "1", "--num-requests", "2", "--dataset", str(data)]
    with OpenAIStub(service_s=0.05) as srv:
        assert main(_openai_args(srv.url, tmp_path, *args)) == 0
        rep = json.loads((tmp_path / "report" / "report.json").read_text())
        assert rep["tokenizer"] == str(engine) and f"input tokens counted by: {engine}" in capsys.readouterr().out
        assert rep["points"][0]["summary"]["input_tokens_per_request"]["mean"] == 10  # letters, not 2 words
        with caplog.at_level(logging.WARNING, logger="trtpipe"):
            assert main(_openai_args(srv.url, tmp_path / "none", *args)) == 0
    rep = json.loads((tmp_path / "none" / "report" / "report.json").read_text())
    assert rep["tokenizer"].startswith("words") and rep["points"][0]["summary"]["input_tokens_per_request"]["mean"] == 2
    assert "counted by: words" in capsys.readouterr().out
    assert any("counted in words, not the model's tokens" in r.getMessage() for r in caplog.records)


@pytest.mark.e2e
def test_a_stub_that_dies_of_a_signal_leaves_its_python_stacks_in_the_server_log(tmp_path):
    """A Python-backend stub killed by SIGSEGV writes faulthandler's report (every thread's stack) to the
    tritonserver log (trtpipe_runtime.bootstrap), instead of vanishing with only Triton's "not healthy" later."""
    import psutil

    with _trivial_tritonserver(tmp_path, token_delay_us=1000) as srv:
        stubs = [p for p in psutil.Process(srv.proc.pid).children(recursive=True)
                 if "triton_python_backend_stub" in " ".join(p.cmdline())]
        assert stubs, "no Python-backend stub under tritonserver"
        os.kill(stubs[0].pid, signal.SIGSEGV)
        deadline = time.monotonic() + 60  # hang guard only
        while "Fatal Python error: Segmentation fault" not in srv.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, srv.log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
    log = srv.log_path.read_text(errors="replace")
    assert "most recent call first" in log and 'File "' in log, log[-3000:]
