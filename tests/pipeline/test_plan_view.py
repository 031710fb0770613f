"""The plan's speed table (pipeline/plan_view.render_performance) on a narrow terminal: numbers are never cut
(a new user's 80-column `make plan` showed '11,3…' for 11,352 tok/s)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from builders import perf_calibration as cal
from builders.plan import BackendPrediction, PerformancePrediction, PredictedPoint


def _perf() -> PerformancePrediction:
    points = [PredictedPoint(concurrency=c, ttft_ms=194.6 * c, tpot_ms=5.61, request_latency_ms=910.0 * c,
                             output_tokens_per_s=11352.0 * c, output_tokens_per_s_per_gpu=10501.0 * c,
                             output_tokens_per_s_per_user=178.3) for c in (1, 64, 512)]
    pred = PerformancePrediction(available=True, source="aiconfigurator 0.12.0", system="h100_sxm", isl=1000,
                                 osl=1000, inputs={"gemm_quant_mode": "fp8_static", "kvcache_quant_mode": "fp8",
                                                   "tp_size": 1, "pp_size": 1, "ctx_tokens": 8192},
                                 backends=[BackendPrediction(backend="trtllm", version="1.3.0rc20",
                                                             database_mode="SILICON", points=points)])
    return cal.apply(pred, 1, False)


def test_no_number_is_cut_at_80_columns():
    perf = _perf()
    out = io.StringIO()
    render = __import__("pipeline.plan_view", fromlist=["render_performance"]).render_performance
    render(SimpleNamespace(performance=perf), Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    cells = [c.strip() for line in text.splitlines() if line.startswith("│") for c in line.split("│")]
    assert not any(c.endswith("…") for c in cells), text  # rich's ellipsis: a cut value
    assert all(len(line) <= 80 for line in text.splitlines()), text
    numbers = set(re.findall(r"\d[\d,]*\.?\d*", text))
    for p in perf.backends[0].points:
        for value in (f"{p.output_tokens_per_s:,.0f}", f"{p.output_tokens_per_s_calibrated:,.0f}",
                      f"{p.output_tokens_per_s_per_gpu:,.0f}", f"{p.ttft_ms:.1f}"):
            assert value in numbers, (value, text)
    assert "tok/s (calibrated) is the throughput to quote" in text


def test_a_wide_terminal_keeps_one_table():
    out = io.StringIO()
    render = __import__("pipeline.plan_view", fromlist=["render_performance"]).render_performance
    render(SimpleNamespace(performance=_perf()), Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert text.count("┏") == 1 and "TTFT ms" in text and "tok/s (calibrated)" in text
