"""Metric functions against hand-computed timelines (definitions: pipeline/loadtest/metrics.py, after genai-perf)."""

import math

import pytest

from pipeline.loadtest.metrics import SLO, RequestRecord, dist, summarize


def rec(i, sent, times, tokens, done=None, error_kind=None, scheduled=None):
    r = RequestRecord(i, scheduled if scheduled is not None else sent, sent=sent, requested_tokens=sum(tokens) or 1)
    r.response_times, r.response_tokens = list(times), list(tokens)
    if error_kind:
        r.error, r.error_kind = "boom", error_kind
    else:
        r.done = done if done is not None else times[-1]
    return r


def test_per_request_metrics_hand_computed():
    # sent at 10.0; tokens at 10.5, 10.7, 11.0 (2 tokens in the last response), empty final at 11.1
    r = rec(0, 10.0, [10.5, 10.7, 11.0, 11.1], [1, 1, 2, 0], scheduled=9.9)
    assert r.output_tokens == 4
    assert r.ttft == pytest.approx(0.5)
    assert r.e2e == pytest.approx(1.1)  # last response, the empty final one included
    assert r.tpot == pytest.approx((1.1 - 0.5) / 3)
    assert r.itl == pytest.approx([0.2, 0.3])  # gaps between token-carrying responses only
    assert r.schedule_lag == pytest.approx(0.1)
    assert r.ttft_sched == pytest.approx(0.6)


def test_one_token_output_has_no_tpot_or_itl():
    r = rec(0, 0.0, [0.2, 0.25], [1, 0])
    assert r.ttft == pytest.approx(0.2) and r.e2e == pytest.approx(0.25)
    assert math.isnan(r.tpot) and r.itl == []
    s = summarize([r], SLO(ttft=0.3, tpot=0.001))
    assert s["tpot_s"]["n"] == 0
    assert s["goodput"]["good_requests"] == 1  # no TPOT to miss


def test_summary_throughput_goodput_errors_and_cancelled():
    ok1 = rec(0, 0.0, [0.1, 0.2, 0.3], [1, 1, 1])            # ttft .1 e2e .3
    ok2 = rec(1, 0.5, [0.9, 1.0, 1.5], [1, 1, 0])            # ttft .4 e2e 1.0
    err = rec(2, 0.6, [0.7], [1], error_kind="server_error")  # partial tokens, failed
    cut = rec(3, 0.8, [], [], error_kind="cut_by_run_end")    # cancelled by the run's bound
    warm = rec(-1, -5.0, [-4.0], [1])
    warm.warmup = True
    s = summarize([warm, ok1, ok2, err, cut], SLO(ttft=0.2))
    assert s["requests"] == {"measured": 4, "sent": 4, "completed": 2, "failed": 2,
                             "errors_by_kind": {"server_error": 1, "cut_by_run_end": 1}}
    assert s["duration_s"] == pytest.approx(1.5)  # first send 0.0 -> last completion 1.5
    assert s["output_tokens"] == 5  # completed requests only, from the server's counts
    assert s["output_token_throughput"] == pytest.approx(5 / 1.5)
    assert s["request_throughput"] == pytest.approx(2 / 1.5)
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["of_requests"] == 4
    assert s["goodput"]["fraction"] == pytest.approx(0.25)  # errors and cut requests count in the denominator
    assert s["goodput"]["requests_per_s"] == pytest.approx(1 / 1.5)
    assert s["ttft_s"]["n"] == 2 and s["ttft_s"]["p50"] == pytest.approx(0.25)
    assert s["itl_s_pooled"]["n"] == 3  # .1,.1 from ok1; .1 from ok2
    assert s["e2e_s"]["max"] == pytest.approx(1.0)


def test_percentiles_carry_counts_and_flag_small_p99():
    d = dist(range(1, 101))
    assert d["n"] == 100 and d["p50"] == pytest.approx(50.5) and "p99_note" not in d
    small = dist([1.0, 2.0, 3.0])
    assert small["n"] == 3 and "p99_note" in small
    assert dist([])["p50"] is None


def test_all_failed_run_has_no_throughput():
    s = summarize([rec(0, 0.0, [], [], error_kind="unavailable")])
    assert s["duration_s"] is None and s["request_throughput"] is None and s["goodput"]["fraction"] == 0


def test_record_roundtrip_as_dict():
    r = rec(0, 10.0, [10.5, 11.0], [1, 1])
    d = r.as_dict(t0=10.0)
    assert d["ttft"] == pytest.approx(0.5) and d["response_times"] == [0.5, 1.0] and d["output_tokens"] == 2


def test_server_counters_sum_kv_reuse_and_draft_acceptance_over_requests():
    from pipeline.loadtest.metrics import server_counters

    srv = [{"kv_cache_alloc_total_blocks": 4, "kv_cache_reused_blocks": 3, "kv_cache_alloc_new_blocks": 1,
            "total_draft_tokens": 10, "total_accepted_draft_tokens": 8, "acceptance_rate": 0.8},
           {"kv_cache_alloc_total_blocks": 6, "kv_cache_reused_blocks": 0, "kv_cache_alloc_new_blocks": 6,
            "total_draft_tokens": 30, "total_accepted_draft_tokens": 6, "acceptance_rate": 0.2}]
    c = server_counters(srv)
    assert c["kv_cache"] == {"reused_blocks": 3, "total_blocks": 10, "reuse_fraction": 0.3, "new_blocks": 7}
    sp = c["speculative"]
    assert (sp["draft_tokens"], sp["accepted_draft_tokens"], sp["acceptance_rate"]) == (40, 14, 0.35)  # not 0.5
    assert sp["acceptance_rate_per_request"]["mean"] == pytest.approx(0.5)
    assert server_counters([{"kv_cache_alloc_total_blocks": 0, "total_draft_tokens": 0}]) == {}


def test_steady_window_is_not_a_sliver_between_a_few_requests():
    """Two requests of a run (a per-model slice of `--models`): the first done at 4.00005 s and the last sent at
    4.0001 s made a window of 0.05 ms, whose one token reported 20,000 tok/s where the run made under 8 (a real report
    said 10,019 of 15.6). The window falls back to the middle 80% of the run, and the steady figure stays near the
    run's own."""
    a = rec(0, 0.0, [1.0 + 0.1 * i for i in range(30)] + [4.00005], [1] * 31)
    b = rec(1, 4.0001, [4.5 + 0.1 * i for i in range(31)], [1] * 31, done=8.0)
    s = summarize([a, b])
    w0, w1 = s["steady_state"]["window_s"]
    assert w1 - w0 == pytest.approx(0.8 * 8.0)
    assert s["steady_state"]["output_token_throughput"] < 2 * s["output_token_throughput"]
