"""Requests refused by the server's admission limit (in flight + queued): the report names the limit."""

import json

from builders.spec import load_spec
from pipeline.cli import DEFAULT_BUILD, main
from pipeline.loadtest.metrics import RequestRecord, admission_refusals, summarize
from tests.loadtest.fake_servers import OpenAIStub


def _openai_args(url, out, *extra):
    return ["loadtest", "run", "--url", url, "--endpoint", "openai-completions", "--warmup", "0", "--input-len", "4",
            "--output-len", "3", "--no-plots", "-o", str(out / "report"), "--out", str(out / "builds"), *extra]


def test_refusals_by_a_servers_admission_limit_are_named_in_the_verdict(tmp_path, capsys):
    """A server that holds 2 requests at once (1 in service + 1 waiting) under 6 concurrent streams refuses the rest
    as overloaded: the verdict and the printed summary say how many, at which load, and the server's own words."""
    with OpenAIStub(service_s=0.2, admit=2) as srv:
        main(_openai_args(srv.url, tmp_path, "--concurrency", "6", "--num-requests", "12"))
    out = capsys.readouterr().out
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    refused = rep["points"][0]["summary"]["requests"]["errors_by_kind"].get("overloaded", 0)
    assert refused > 0
    why = rep["verdict"]["refused_as_overloaded"]["0"]
    assert why.startswith(f"{refused} of 12 requests refused as overloaded at 6 concurrent streams: the server's "
                          "admission limit refused them (its words: HTTP 503: ")
    assert "serving.max_queue_size is 1" in why
    assert f"point 0: {why}" in out


def _record(i: int, overloaded: bool) -> RequestRecord:
    r = RequestRecord(i, 0.0, sent=0.0, requested_tokens=1)
    if overloaded:
        r.error, r.error_kind = "overloaded: retry later", "overloaded"
    else:
        r.response_times, r.response_tokens, r.done = [0.1], [1], 0.1
    return r


def test_refusals_name_the_builds_admission_capacity():
    """With the build's manifest (its settings, as trtpipe build writes them) the reason is the capacity the plan
    states: limits.max_batch_size in flight + serving.max_queue_size queued, and by how much the load exceeds it."""
    settings = load_spec(DEFAULT_BUILD, "cpu").settings
    lim, sv = settings.limits, settings.serving
    cap = lim.max_batch_size + sv.max_queue_size
    records = [_record(i, overloaded=i >= cap) for i in range(50)]
    point = {"point": {"mode": "closed", "concurrency": 50}, "summary": summarize(records),
             "requests": [r.as_dict() for r in records]}
    got = admission_refusals(point, {"settings": settings.model_dump(mode="json")})
    assert got["refused"] == 50 - cap and got["capacity"] == cap
    assert got["why"] == (f"{50 - cap} of 50 requests refused as overloaded at 50 concurrent streams: the build admits "
                          f"{lim.max_batch_size} in flight (limits.max_batch_size) + {sv.max_queue_size} queued "
                          f"(serving.max_queue_size) = {cap} requests at once; more concurrent requests are refused "
                          f"as overloaded at once (raise serving.max_queue_size, 0 = no limit); 50 streams exceed "
                          f"those {cap}")
    ok = {**point, "summary": summarize([_record(i, False) for i in range(5)])}
    assert admission_refusals(ok, {"settings": settings.model_dump(mode="json")}) is None
