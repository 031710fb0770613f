"""Report files (JSON with every request, CSV summary, plots) and ``compare``."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from plugins.errors import PipelineError

CSV_FIELDS = (
    ("point", lambda p: p["point"].get("concurrency", p["point"].get("rate"))),
    ("mode", lambda p: p["point"]["mode"]),
    ("model", lambda p: p.get("model", "all")),
    ("valid", lambda p: p["validity"]["valid"]),
    ("completed", lambda p: p["summary"]["requests"]["completed"]),
    ("failed", lambda p: p["summary"]["requests"]["failed"]),
    ("duration_s", lambda p: p["summary"]["duration_s"]),
    ("request_throughput", lambda p: p["summary"]["request_throughput"]),
    ("output_token_throughput", lambda p: p["summary"]["output_token_throughput"]),
    ("steady_output_token_throughput", lambda p: p["summary"]["steady_state"]["output_token_throughput"]),
    ("goodput_rps", lambda p: p["summary"]["goodput"]["requests_per_s"]),
    ("goodput_fraction", lambda p: p["summary"]["goodput"]["fraction"]),
    *((f"{m}_{q}", (lambda m, q: lambda p: p["summary"][m][q])(m, q))
      for m in ("ttft_s", "tpot_s", "itl_s_pooled", "e2e_s") for q in ("p50", "p90", "p99", "n")),
    ("schedule_lag_p95_s", lambda p: p["summary"].get("schedule_lag_s", {}).get("p95")),
    ("server_ttft_p50_s", lambda p: p["summary"].get("server_side", {}).get("ttft_s", {}).get("p50")),
    ("kv_cache_reuse_fraction", lambda p: p["summary"].get("server_side", {}).get("kv_cache", {}).get("reuse_fraction")),
    ("acceptance_rate", lambda p: p["summary"].get("server_side", {}).get("speculative", {}).get("acceptance_rate")),
    ("achieved_exact_fraction", lambda p: p["summary"]["achieved_lengths"].get("exact_fraction")),
    ("answers_checked", lambda p: p["summary"]["structured"]["checked"]),
    ("answers_valid", lambda p: p["summary"]["structured"]["valid"]),
    ("answers_valid_fraction", lambda p: p["summary"]["structured"]["valid_fraction"]),
)


def write_reports(report: dict, out_dir: Path, plots: bool = True) -> dict[str, Path]:
    """report.json, summary.csv and the PNG plots into ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "csv": out_dir / "summary.csv"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(paths["json"])
    with open(paths["csv"], "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([name for name, _ in CSV_FIELDS])
        for p in report["points"]:
            for row in model_rows(p):
                w.writerow([_cell(get, row) for _, get in CSV_FIELDS])
    if plots:
        from pipeline.loadtest.plots import write_plots

        paths.update(write_plots(report, out_dir))
    return paths


def model_rows(point: dict) -> list[dict]:
    """A report point as CSV rows: the totals (model ``all``), then, for a run over several models (``--models``),
    one row per model with its own figures (``summary.by_model``)."""
    return [point] + [{**point, "model": m, "summary": s} for m, s in point["summary"].get("by_model", {}).items()]


def _cell(get, p):
    try:
        v = get(p)
    except (KeyError, TypeError):
        return ""
    return "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)


def load(path: Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"{path}: not a load-test report ({exc})") from exc
    if data.get("tool") != "trtpipe loadtest":
        raise PipelineError(f"{path}: not a report written by `trtpipe loadtest run`")
    return data


def format_summary(report: dict) -> str:
    """A table of the main figures per point, with validity (a run over several models: each model's row under its
    point's, the load followed by the model's name)."""
    checked = any("structured" in p["summary"] for p in report["points"])
    rows = [("load", "req/s", "out tok/s", "steady tok/s", "TTFT p50/p99 ms", "TPOT p50 ms", "ITL p50 ms",
             "E2E p50/p99 s", "goodput", "errors", "valid") + (("answers ok",) if checked else ())]
    for p in (row for point in report["points"] for row in model_rows(point)):
        s = p["summary"]
        st = s.get("structured")
        answers = (f"{st['valid']}/{st['checked']}",) if st else (("-",) if checked else ())
        load_ = f"c={p['point']['concurrency']}" if p["point"]["mode"] == "closed" else f"r={p['point']['rate']:g}"
        load_ += f" {p['model']}" if "model" in p else ""
        rows.append((load_, _f(s["request_throughput"]), _f(s["output_token_throughput"], 1),
                     _f(s["steady_state"]["output_token_throughput"], 1),
                     f"{_f(_ms(s['ttft_s']['p50']), 1)}/{_f(_ms(s['ttft_s']['p99']), 1)}"
                     + ("*" if "p99_note" in s["ttft_s"] else ""),
                     _f(_ms(s["tpot_s"]["p50"]), 2), _f(_ms(s["itl_s_pooled"]["p50"]), 2),
                     f"{_f(s['e2e_s']['p50'], 3)}/{_f(s['e2e_s']['p99'], 3)}",
                     _f(s["goodput"]["fraction"], 2), str(s["requests"]["errors_by_kind"] or 0),
                     "yes" if p["validity"]["valid"] else "NO") + answers)
    text = _table(rows)
    for k, p in enumerate(report["points"]):
        st = p["summary"].get("structured")
        if st:
            what = f"{st['kind']}" + (f" {st['source']}" if st.get("source") and st["kind"] != "json_object" else "")
            fails = ", ".join(f"{c}: {n}" for c, n in st["failures_by_cause"].items()) or "none"
            text += (f"\npoint {k}: answers {'checked against (not sent)' if not st['sent'] else 'constrained by'} "
                     f"{what}, {st['validated_with']}: {st['valid']}/{st['checked']} valid; failures: {fails}")
    if report.get("tokenizer"):
        text += f"\ninput tokens counted by: {report['tokenizer']}"
    notes = [f"point {k}: INVALID: {r}" for k, p in enumerate(report["points"]) for r in p["validity"]["reasons"]]
    notes += [f"point {k}: {p['admission_refusals']['why']}" for k, p in enumerate(report["points"])
              if p.get("admission_refusals")]
    if any("p99_note" in p["summary"]["ttft_s"] for p in report["points"]):
        notes.append("* p99 from fewer than 100 samples: not reliable")
    return text + ("\n" + "\n".join(notes) if notes else "")


def _ms(x):
    return None if x is None else x * 1e3


def _f(x, nd=2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows)


COMPARE = (("request_throughput", "req/s", 1), ("output_token_throughput", "out tok/s", 1),
           ("ttft_s.p50", "TTFT p50 s", -1), ("ttft_s.p99", "TTFT p99 s", -1), ("tpot_s.p50", "TPOT p50 s", -1),
           ("itl_s_pooled.p50", "ITL p50 s", -1), ("e2e_s.p50", "E2E p50 s", -1), ("e2e_s.p99", "E2E p99 s", -1),
           ("goodput.fraction", "goodput", 1))


def compare(a: dict, b: dict) -> str:
    """Point-by-point table of A vs B (B/A ratio; 'better'/'worse' by the metric's direction)."""
    rows = [("point", "metric", "A", "B", "B/A", "")]
    for k, (pa, pb) in enumerate(zip(a["points"], b["points"])):
        label = ",".join(f"{x}={y}" for x, y in pa["point"].items() if x != "mode")
        if pa["point"] != pb["point"]:
            label += f" vs {','.join(f'{x}={y}' for x, y in pb['point'].items() if x != 'mode')}"
        extra_rows = (("structured.valid_fraction", "answers valid", 1),) \
            if "structured" in pa["summary"] or "structured" in pb["summary"] else ()
        for key, name, sign in COMPARE + extra_rows:
            va, vb = _get(pa["summary"], key), _get(pb["summary"], key)
            ratio = vb / va if va and vb is not None else None
            tag = "" if ratio is None or abs(ratio - 1) < 0.05 else (
                "better" if (ratio > 1) == (sign > 0) else "worse")
            rows.append((label, name, _f(va, 4), _f(vb, 4), _f(ratio, 3), tag))
    extra = []
    if len(a["points"]) != len(b["points"]):
        extra.append(f"A has {len(a['points'])} points, B has {len(b['points'])}: compared the first "
                     f"{min(len(a['points']), len(b['points']))}")
    for name, r in (("A", a), ("B", b)):
        bad = r["verdict"]["invalid_points"]
        if bad:
            extra.append(f"{name}: points {bad} are INVALID (see their reasons); do not compare them")
    return _table(rows) + ("\n" + "\n".join(extra) if extra else "")


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d
