"""How far aiconfigurator's predictions, and the calibrated ones, are from TensorRT-LLM's published numbers.

1. Every point of TensorRT-LLM's perf-overview throughput tables (docs/source/performance/perf-overview.md, NVIDIA/
   TensorRT-LLM commit 00f37686; recorded in scripts/bench/data/perf_overview_00f37686.json) that aiconfigurator
   0.12.0 covers, against:
   - **aiconfigurator** (uncorrected): its best output tokens/s over batch sizes 16..2048 at the same ISL/OSL,
     tp, pp and precision (FP8: gemm fp8_static, MoE fp8; FP4: nvfp4), FP8 KV cache, ctx_tokens 8192
     (trtllm-bench's default max_num_tokens), KV memory fraction 0.9; a batch its KV check warns about is not
     counted. MoE: moe_ep = tp, moe_tp 1 (the file does not publish ep).
   - **with the published MoE options**: MoE points again with attention DP over the tp ranks (tp_size 1,
     attention_dp_size = tp; the batch per rank), as the file's MoE ``llm_options.yml`` sets ``enable_attention_dp``.
   - **calibrated** (builders/perf_calibration.py), leave one model out, per regime: dense, aiconfigurator's
     tokens/s at the KV capacity the plan computes (builders/plan.py's weights, activations and KV bytes per token,
     fraction 0.95 as the published runs used "in many cases", max_batch_size 2048, max_num_tokens 8192, 32-token
     blocks, ISL+OSL per sequence; over pp stages, aiconfigurator's batch is per stage); MoE, the attention-DP
     best; each times the factor fitted on every other model's points of its regime.
   aiconfigurator's answers are cached in scripts/bench/data/perf_overview_00f37686_aiconfigurator.json
   (``--refresh`` reruns it, ~21 s on 2 cores); everything else runs without it.
2. ``--fit`` writes configs/perf_calibration.json: the constants fitted on every point of each regime, for the
   product.
3. ``--timings``: the wall time of ``trtpipe tune`` and ``trtpipe plan`` for the llama-3-8b build on h200, cold
   and cached.

    python scripts/bench/bench_prediction.py [--refresh] [--fit] [--timings] [--json docs/benchmarks/prediction.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from builders import perf_calibration as cal  # noqa: E402

DATA = REPO / "scripts" / "bench" / "data"
POINTS = DATA / "perf_overview_00f37686.json"
ANSWERS = DATA / "perf_overview_00f37686_aiconfigurator.json"
BATCHES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
KV_FRACTION = 0.95
"""perf-overview.md: "In many cases, we also use a higher KV cache percentage by setting
--kv_cache_free_gpu_mem_fraction 0.95"."""
MAX_BATCH_SIZE, MAX_NUM_TOKENS, TOKENS_PER_BLOCK = 2048, 8192, 32
AIC_CONFIGS = "aiconfigurator_core/model_configs"


def load_points() -> tuple[dict, list[dict]]:
    """The recorded perf-overview table: (meta, points)."""
    d = json.loads(POINTS.read_text())
    return d["meta"], d["points"]


def hf_config(source: str) -> dict:
    """config.json of ``tests/assets:<dir>`` or ``aiconfigurator_core:<file>`` (aiconfigurator's own copy)."""
    kind, name = source.split(":", 1)
    if kind == "tests/assets":
        return json.loads((REPO / "tests" / "assets" / name / "config.json").read_text())
    from builders import perf_model

    site = subprocess.run([str(perf_model.interpreter()), "-c", "import aiconfigurator_core, os; "
                           "print(os.path.dirname(aiconfigurator_core.__file__))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return json.loads((Path(site) / "model_configs" / name).read_text())


def plan_kv_capacity(cfg: dict, point: dict, device_bytes: int) -> tuple[int | None, str]:
    """Sequences of ISL+OSL tokens the plan's KV pool holds over the instance (builders/plan.py compute_plan's
    arithmetic), or (None, why) where the plan cannot read the model."""
    from builders import plan as P
    from builders.model_shape import ModelShape
    from plugins.recipes import recipe

    try:
        shape = ModelShape.from_hf_config(cfg)
    except Exception as e:  # noqa: BLE001 - Llama 4's nested config: the plan does not model it
        return None, f"the plan cannot read the model ({type(e).__name__})"
    tp, pp = point["tp"], point["pp"]
    ep = tp if shape.is_moe else 1
    per_pp, *_ = P._weights(shape, tp, pp, recipe("fp8" if point["quant"] == "FP8" else "nvfp4"), 128, 2,
                            dedupe_tied=False, moe_tp=1, moe_ep=ep)
    acts = P.activation_bytes(shape, tp, -(-shape.vocab_size // tp), MAX_NUM_TOKENS, MAX_BATCH_SIZE, 1, 2)
    free = device_bytes - P.GPU_RUNTIME_RESERVE_BYTES - max(per_pp) - acts
    blocks = int(max(0, free) * KV_FRACTION) // (P.kv_bytes_per_token(shape, tp, pp, 1) * TOKENS_PER_BLOCK)
    return blocks // -(-(point["isl"] + point["osl"]) // TOKENS_PER_BLOCK), ""


def refresh() -> dict:
    """aiconfigurator on every point x batch (cold), and the plan's KV capacity of each point: the answers file."""
    from builders import perf_model

    meta, points = load_points()
    dirs, cfgs, req, caps = {}, {}, [], []
    for p in points:
        if p["config"] not in dirs:
            cfgs[p["config"]] = hf_config(p["config"])
            dirs[p["config"]] = str(perf_model.model_dir(cfgs[p["config"]]))
        fp4 = p["quant"] == "FP4"
        caps.append(plan_kv_capacity(cfgs[p["config"]], p, meta["device_memory_bytes"][p["system"]]))
        base = {"model_dir": dirs[p["config"]], "system": p["system"], "backend": "trtllm", "isl": p["isl"],
                "osl": p["osl"], "ctx_tokens": MAX_NUM_TOKENS, "tp_size": p["tp"], "pp_size": p["pp"],
                "moe_tp_size": 1 if p["moe"] else None, "moe_ep_size": p["tp"] if p["moe"] else None,
                "gemm_quant_mode": "nvfp4" if fp4 else "fp8_static",
                "moe_quant_mode": ("nvfp4" if fp4 else "fp8") if p["moe"] else None,
                "kvcache_quant_mode": "fp8", "free_gpu_memory_fraction": 0.9}
        req += [{**base, "batch_size": bs} for bs in BATCHES]
        if p["moe"]:  # the published MoE options: attention DP over the tp ranks, the batch per rank
            req += [{**base, "tp_size": 1, "attention_dp_size": p["tp"], "batch_size": bs} for bs in BATCHES]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRTPIPE_CACHE"] = tmp  # cold: nothing cached
        answers, _ = perf_model.estimate(req, use_cache=False)
    answers = iter(answers)

    def grid() -> list[dict]:
        out = []
        for bs, a in zip(BATCHES, answers):
            out.append({"batch": bs, "tokens_per_s": round(a["tokens_per_s"], 1), "kv_warning": bool(
                a.get("kv_cache_warning")), "mode": a["database_mode"]} if a.get("ok") else
                {"batch": bs, "error": a.get("error")})
        return out

    out = []
    for i, p in enumerate(points):
        cap, why = caps[i]
        out.append({"point": i, "plan_kv_sequences": cap, **({"plan_kv_why_none": why} if why else {}),
                    "grid": grid(), **({"grid_attention_dp": grid()} if p["moe"] else {})})
    return {"meta": {"aiconfigurator": perf_model.AICONFIGURATOR_VERSION, "date": time.strftime("%Y-%m-%d"),
                     "elapsed_s": round(time.monotonic() - t0, 1), "points_file": POINTS.name,
                     "batches": list(BATCHES),
                     "inputs": "backend trtllm, ctx_tokens 8192, kvcache fp8, free_gpu_memory_fraction 0.9, "
                               "FP8: gemm fp8_static / moe fp8, FP4: nvfp4 / nvfp4, MoE: moe_tp 1, moe_ep = tp; "
                               "MoE grid_attention_dp: tp_size 1, attention_dp_size = tp, batch per rank",
                     "plan_kv": f"fraction {KV_FRACTION}, max_batch_size {MAX_BATCH_SIZE}, max_num_tokens "
                                f"{MAX_NUM_TOKENS}, tokens_per_block {TOKENS_PER_BLOCK}, ISL+OSL per sequence"},
            "answers": out}


def rows(points: list[dict], answers: list[dict]) -> tuple[list[dict], list[dict]]:
    """(covered rows with aiconfigurator, the base at the plan's KV capacity and the LOMO calibrated number;
    uncovered points with why). Pure: the committed data files in, the table's numbers out."""
    table, uncovered = [], []
    for p, a in zip(points, answers):
        ok = [g for g in a["grid"] if "tokens_per_s" in g]
        unwarned = [g for g in ok if not g["kv_warning"]]
        if not unwarned:
            errs = sorted({g.get("error") or "its KV check warns at every batch" for g in a["grid"]
                           if "tokens_per_s" not in g or g["kv_warning"]})
            uncovered.append({**p, "why": errs[0]})
            continue
        best = max(unwarned, key=lambda g: g["tokens_per_s"])
        adp = [g for g in a.get("grid_attention_dp", []) if "tokens_per_s" in g and not g["kv_warning"]]
        best_adp = max(adp, key=lambda g: g["tokens_per_s"]) if adp else None
        cap = a["plan_kv_sequences"]
        base = None
        if cap is not None:  # aiconfigurator's batch is per pipeline stage
            base = cal.at_capacity([(g["batch"], g["tokens_per_s"]) for g in ok], min(cap // p["pp"], MAX_BATCH_SIZE))
        table.append({**p, "aiconfigurator": best["tokens_per_s"], "aiconfigurator_batch": best["batch"],
                      "aiconfigurator_attention_dp": best_adp and best_adp["tokens_per_s"],
                      "aiconfigurator_attention_dp_batch": best_adp and best_adp["batch"],
                      "plan_kv_sequences": cap, "at_plan_kv": base,
                      # dense: at the plan's KV capacity; MoE: attention DP's best (the plan cannot read Llama 4)
                      "regime": cal.regime(p["moe"], attention_dp=p["moe"]),
                      "calibration_base": best_adp and best_adp["tokens_per_s"] if p["moe"] else base,
                      "calibration_refused": ("" if best_adp else "no attention-DP answer") if p["moe"] else
                      ("" if base else a.get("plan_kv_why_none"))})
    for which in cal.REGIMES:  # each regime fitted on its own points, leaving the scored model out
        fit_rows = [r for r in table if r["regime"] == which and not r["calibration_refused"]]
        lomo = cal.leave_one_model_out([{"model": r["model"], "pp_size": r["pp"], "predicted": r["calibration_base"],
                                         "published": r["output_tok_s"]} for r in fit_rows])
        for r, c in zip(fit_rows, lomo):
            r["calibrated"], r["c0"], r["c_pp"] = c["calibrated"], c["c0"], c["c_pp"]
    for r in table:
        r.setdefault("calibrated", None)
        r["aiconfigurator_error_pct"] = round(100 * (r["aiconfigurator"] / r["output_tok_s"] - 1), 1)
        r["aiconfigurator_attention_dp_error_pct"] = (None if r["aiconfigurator_attention_dp"] is None else round(
            100 * (r["aiconfigurator_attention_dp"] / r["output_tok_s"] - 1), 1))
        r["calibrated_error_pct"] = (None if r["calibrated"] is None else
                                     round(100 * (r["calibrated"] / r["output_tok_s"] - 1), 1))
    return table, uncovered


def _published_options(r: dict) -> float:
    """aiconfigurator's number with the published run's options: attention DP for MoE (perf-overview.md's MoE
    ``llm_options.yml``), as before for dense models."""
    return r["aiconfigurator"] if r["aiconfigurator_attention_dp"] is None else r["aiconfigurator_attention_dp"]


def summaries(table: list[dict]) -> dict:
    """MAE and worst error, aiconfigurator vs calibrated, over the subsets the page reports."""
    out = {}
    subsets = {"every covered point": lambda r: True,
               "dense (calibrated)": lambda r: not r["moe"] and r["calibrated"] is not None,
               "dense, pp 1": lambda r: not r["moe"] and r["calibrated"] is not None and r["pp"] == 1,
               "mixture-of-experts": lambda r: r["moe"], "the 12 points of the page before": lambda r: (
                   r["model"] in ("Llama-3.1-8B", "Llama-3.3-70B") and r["gpu"] in ("H100", "H200")
                   and (r["isl"], r["osl"]) in ((128, 128), (1000, 1000), (2048, 2048)))}
    for m in sorted({r["model"] for r in table}):
        subsets[m] = lambda r, m=m: r["model"] == m
    for name, sel in subsets.items():
        rs = [r for r in table if sel(r)]
        if not rs:
            continue
        calib = [(r["calibrated"] if r["calibrated"] is not None else _published_options(r), r["output_tok_s"])
                 for r in rs]
        out[name] = {"aiconfigurator": cal.error_summary((r["aiconfigurator"], r["output_tok_s"]) for r in rs),
                     "aiconfigurator_attention_dp": cal.error_summary((_published_options(r), r["output_tok_s"])
                                                                      for r in rs),
                     "calibrated": cal.error_summary(calib)}
    return out


def fit_constants(table: list[dict], summary: dict) -> dict:
    """configs/perf_calibration.json: the constants fitted on every point of each regime, with provenance."""
    fit_rows = {which: [{"pp_size": r["pp"], "predicted": r["calibration_base"], "published": r["output_tok_s"]}
                        for r in table if r["regime"] == which and r["calibrated"] is not None]
                for which in cal.REGIMES}
    m0, m_pp = cal.fit(fit_rows["moe_attention_dp"])
    m = summary["mixture-of-experts"]
    moe = {"c0": round(m0, 4), "c_pp": round(m_pp, 4),
           "formula": "calibrated tok/s = aiconfigurator tok/s x exp(c0 + c_pp x ln(pp_size)) (MoE, attention DP)",
           "source": (f"least squares on ln(published / predicted) over {len(fit_rows['moe_attention_dp'])} "
                      "mixture-of-experts points of the same file, aiconfigurator 0.12.0 with attention DP over the "
                      "tp ranks (the published MoE options), its best tokens/s over batch sizes 16-2048 a rank; "
                      "python scripts/bench/bench_prediction.py --fit"),
           "stated_error": (f"leave one model out over {m['calibrated']['points']} mixture-of-experts published "
                            f"points: mean absolute error {m['calibrated']['mae_pct']}%, worst "
                            f"{m['calibrated']['worst_pct']:+}% (aiconfigurator with attention DP alone: "
                            f"{m['aiconfigurator_attention_dp']['mae_pct']}%, worst "
                            f"{m['aiconfigurator_attention_dp']['worst_pct']:+}%)")}
    c0, c_pp = cal.fit(fit_rows["dense"])
    fit_rows = fit_rows["dense"]
    s, s1 = summary["dense (calibrated)"], summary["dense, pp 1"]
    return {"c0": round(c0, 4), "c_pp": round(c_pp, 4),
            "formula": "calibrated tok/s = aiconfigurator tok/s x exp(c0 + c_pp x ln(pp_size)) (dense models)",
            "source": (f"least squares on ln(published / predicted) over {len(fit_rows)} dense points of NVIDIA/"
                       "TensorRT-LLM docs/source/performance/perf-overview.md @ 00f37686 "
                       "(scripts/bench/data/perf_overview_00f37686*.json), aiconfigurator 0.12.0 at the plan's KV "
                       "capacity; python scripts/bench/bench_prediction.py --fit"),
            "stated_error": (f"leave one model out over {s['calibrated']['points']} dense published points: mean "
                             f"absolute error {s['calibrated']['mae_pct']}%, worst {s['calibrated']['worst_pct']:+}% "
                             f"(aiconfigurator alone: {s['aiconfigurator']['mae_pct']}%, worst "
                             f"{s['aiconfigurator']['worst_pct']:+}%); at pp_size 1 ({s1['calibrated']['points']} "
                             f"points): {s1['calibrated']['mae_pct']}%, worst {s1['calibrated']['worst_pct']:+}% "
                             f"(aiconfigurator: {s1['aiconfigurator']['mae_pct']}%, worst "
                             f"{s1['aiconfigurator']['worst_pct']:+}%)"),
            "fitted": time.strftime("%Y-%m-%d"), "moe_attention_dp": moe}


def _timed(cmd: list[str], env: dict) -> float:
    t = time.monotonic()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return round(time.monotonic() - t, 2)


def timings() -> dict:
    trtpipe = str(REPO / ".venv" / "bin" / "trtpipe")
    build = ["configs/builds/llama-3-8b.yaml", "--target", "h200"]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRTPIPE_CACHE": tmp}
        plan = [trtpipe, "plan", *build, "--isl", "1000", "--osl", "1000", "--no-progress",
                "--output", f"{tmp}/plan.json"]
        out["plan_without_predictions_s"] = _timed(plan + ["--no-predict"], env)
        out["plan_cold_s"] = _timed(plan, env)
        out["plan_cached_s"] = _timed(plan, env)
        tune = [trtpipe, "tune", *build, "--isl", "1000", "--osl", "1000", "--ttft-ms", "500", "--tpot-ms", "20",
                "--no-progress", "--force", "--output", f"{tmp}/tuned.yaml"]
        out["tune_cold_s"] = _timed(tune, env)
        out["tune_cached_s"] = _timed(tune, env)
    return out


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.1f}%"


def markdown(table: list[dict], uncovered: list[dict], summary: dict) -> str:
    lines = ["| model | GPU | tp | pp | quant | ISL/OSL | published tok/s | aiconfigurator (batch) | error | "
             "with attention DP (batch a rank) | error | calibrated, LOMO (plan KV seqs) | error |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        c = "-" if r["calibrated"] is None else f"{r['calibrated']:,.0f}" + (
            "" if r["moe"] else f" ({r['plan_kv_sequences']})")
        d = ("-" if r["aiconfigurator_attention_dp"] is None else
             f"{r['aiconfigurator_attention_dp']:,.0f} ({r['aiconfigurator_attention_dp_batch']})")
        lines.append(f"| {r['model']} | {r['gpu']} | {r['tp']} | {r['pp']} | {r['quant']} | {r['isl']}/{r['osl']} | "
                     f"{r['output_tok_s']:,} | {r['aiconfigurator']:,.0f} ({r['aiconfigurator_batch']}) | "
                     f"{_pct(r['aiconfigurator_error_pct'])} | {d} | "
                     f"{_pct(r['aiconfigurator_attention_dp_error_pct'])} | {c} | {_pct(r['calibrated_error_pct'])} |")
    lines += ["", "| points | n | aiconfigurator MAE | worst | published options (MoE: attention DP) MAE | worst | "
              "calibrated (LOMO) MAE | worst |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        a, d, c = s["aiconfigurator"], s["aiconfigurator_attention_dp"], s["calibrated"]
        lines.append(f"| {name} | {a['points']} | {a['mae_pct']}% | {a['worst_pct']:+}% | {d['mae_pct']}% | "
                     f"{d['worst_pct']:+}% | {c['mae_pct']}% | {c['worst_pct']:+}% |")
    if uncovered:
        lines += ["", "Not covered:"] + [f"- {u['model']} {u['gpu']} tp{u['tp']} pp{u['pp']} {u['isl']}/{u['osl']}: "
                                         f"{u['why']}" for u in uncovered]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refresh", action="store_true", help="rerun aiconfigurator on every point (cold)")
    ap.add_argument("--fit", action="store_true", help="write configs/perf_calibration.json")
    ap.add_argument("--timings", action="store_true", help="also time trtpipe plan / tune")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.refresh or not ANSWERS.is_file():
        d = refresh()
        with ANSWERS.open("w") as f:  # one point a line: reviewable diffs
            f.write('{"meta": ' + json.dumps(d["meta"]) + ',\n "answers": [\n')
            f.write(",\n".join("  " + json.dumps(a) for a in d["answers"]) + "\n ]\n}\n")
    meta, points = load_points()
    answers = json.loads(ANSWERS.read_text())
    table, uncovered = rows(points, answers["answers"])
    summary = summaries(table)
    print(markdown(table, uncovered, summary))
    if args.fit:
        (REPO / "configs" / "perf_calibration.json").write_text(json.dumps(fit_constants(table, summary), indent=1)
                                                                + "\n")
    t = timings() if args.timings else None
    if t:
        print("\n| step | wall s |\n|---|---:|\n" + "\n".join(f"| {k} | {v} |" for k, v in t.items()))
    if args.json:
        run = {"date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "python": platform.python_version(),
               "command": "python scripts/bench/bench_prediction.py " + " ".join(sys.argv[1:]),
               "source": meta["source"], "aiconfigurator": answers["meta"]}
        drop = ("checkpoint", "config", "system", "ep")  # in the points file; one row a line below
        digits = {"at_plan_kv": 1, "calibration_base": 1, "calibrated": 1, "c0": 5, "c_pp": 5}
        rows_ = [json.dumps({k: (round(v, digits[k]) if k in digits and v is not None else v)
                             for k, v in r.items() if k not in drop}) for r in table]
        head = json.dumps({"meta": run, "summary": summary, "not_covered": uncovered, "timings": t}, indent=1)
        Path(args.json).write_text(head[:-2] + ',\n "validation": [\n  ' + ",\n  ".join(rows_) + "\n ]\n}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
