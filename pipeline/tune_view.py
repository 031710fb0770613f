"""Render a :class:`~pipeline.tune.TuneResult` for ``trtpipe tune``: the search in numbers, the accuracy each recipe
was judged by, the Pareto table, the choice with its reasons, and aiconfigurator's own picks beside it."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

from builders.perf_model import AICONFIGURATOR_VERSION
from pipeline.tune import Scored, TuneResult, reasons

PARETO_ROWS = 15


def _row(s: Scored, mark: str = "") -> list[str]:
    p, c = s.prediction, s.candidate
    ep = f" ep{c.moe_ep_size}" if c.moe_ep_size else ""
    return [mark + c.quant_algo, c.kv_cache_quant_algo or "16-bit", f"{c.tp_size}x{c.pp_size}{ep}",
            str(c.max_batch_size), str(c.max_num_tokens), f"{c.kv_cache_free_gpu_mem_fraction:g}", str(s.concurrency),
            f"{p['ttft_ms']:.0f}", f"{p['tpot_ms']:.1f}", f"{p['tokens_per_s_per_gpu']:,.0f}",
            "-" if p.get("tokens_per_s_per_gpu_calibrated") is None else f"{p['tokens_per_s_per_gpu_calibrated']:,.0f}",
            f"{p['tokens_per_s_per_user']:,.0f}", "yes" if s.meets_slo else s.misses]


def _table(title: str, rows: list[Scored], best: Optional[Scored]) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("quant", "kv", "tpxpp", "bs", "mnt", "kvfrac", "conc", "TTFT", "TPOT", "tok/s/GPU", "calibrated",
                "tok/s/user", "SLO"):
        t.add_column(col, justify="left" if col in ("quant", "kv", "tpxpp", "SLO") else "right")
    for s in rows:
        t.add_row(*_row(s, "*" if s is best else ""))
    return t


def render_tune(build, result: TuneResult, default: Optional[list[tuple[dict, str]]] = None,
                console: Optional[Console] = None) -> None:
    """Print the tune report (and, with ``default``, aiconfigurator's picks and whether our rules accept them)."""
    con = console or Console()
    slo = result.slo
    n = len(result.scored)
    refused = sum(result.refusals.values())
    con.print(f"tune {build.name} for {build.target}: ISL {slo.isl} / OSL {slo.osl}, TTFT <= {slo.ttft_ms:g} ms, "
              f"TPOT <= {slo.tpot_ms:g} ms, up to {result.gpus} GPU(s) per instance", highlight=False)
    by_rule = ", ".join(f"{k} {v}" for k, v in sorted(result.refusals.items(), key=lambda kv: -kv[1]))
    con.print(f"{n} candidates: {refused} refused ({by_rule or 'none'}); {result.predicted_points} distinct "
              f"predictions ({result.cached_points} cached) by aiconfigurator {AICONFIGURATOR_VERSION} "
              f"(trtllm {result.backend_version or '?'} database); {result.elapsed_s:.1f} s", highlight=False)
    acc = "; ".join(f"{q} {'-' if d is None else f'+{d:.1f}%'} ({src})" for q, (d, src) in result.accuracy.items())
    con.print(f"perplexity delta by recipe: {acc}", highlight=False)
    if any("recorded on" in src for _, src in result.accuracy.values()):
        con.print("  (the recorded table was measured on a 135M model, which loses more to quantization than a "
                  "larger one: run `trtpipe verify` on this build for its own numbers, or raise "
                  "--max-ppl-delta-pct)", highlight=False)
    front = result.pareto()
    con.print(_table(f"Pareto front (tok/s/GPU vs tok/s/user), {min(len(front), PARETO_ROWS)} of {len(front)}; "
                     "* the choice; bs max_batch_size, mnt max_num_tokens, kvfrac kv_cache_free_gpu_mem_fraction, "
                     "conc requests in flight, TTFT/TPOT ms, calibrated tok/s/GPU builders/perf_calibration.py's "
                     "(the ranking is aiconfigurator's)", front[:PARETO_ROWS], result.best))
    if result.best is None:
        con.print(_table("closest candidates (none meets the targets)", result.closest(), None))
        return
    if result.best not in front[:PARETO_ROWS]:
        con.print(_table("the choice", [result.best], result.best))
    con.print(f"choice: {result.best.candidate.label()}: {result.best.goodput_per_gpu:,.0f} output tok/s per GPU "
              f"within the SLO (predicted)", highlight=False)
    for line in reasons(result):
        con.print(f"  {line}", highlight=False)
    if default is not None:
        t = Table(title="aiconfigurator's own default search (cli_default, agg) for the same inputs",
                  title_justify="left")
        for col in ("its pick", "TTFT ms", "TPOT ms", "tok/s/GPU", "vs ours", "our rules"):
            t.add_column(col)
        ours = result.best.goodput_per_gpu
        for pick, verdict in default:
            t.add_row(f"{pick['gemm']}/kv {pick['kvcache']} tp{pick['tp_size']} pp{pick['pp_size']} "
                      f"bs{pick['batch_size']} ctx{pick['ctx_tokens']}", f"{pick['ttft_ms']:.0f}",
                      f"{pick['tpot_ms']:.1f}", f"{pick['tokens_per_s_per_gpu']:,.0f}",
                      f"{100 * (ours / pick['tokens_per_s_per_gpu'] - 1):+.0f}%" if pick["tokens_per_s_per_gpu"]
                      else "-", verdict or "accepted")
        con.print(t)
