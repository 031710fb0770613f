"""Markdown tables of docs/benchmarks/h200.md from one run of scripts/h200_session.sh.

    python3 scripts/h200_tables.py OUT_DIR [RESULTS_DIR:MODEL ...]
      OUT_DIR: the `out/` folder of results.tgz (bench-<tag>.json files); RESULTS_DIR:MODEL: a step's
      results/ folder read phase by phase (for a step the session ended before it finished)

Reads every bench-<tag>.json that scripts/bench_h200.py wrote in OUT_DIR (one per `bench` step of the
session: cb, static, smol, defaults) and prints, per model: the per-point table (served with the
dispatcher thread, served inline, in-process, static baseline), the ratios, where the served time goes
(responses per step, the send round trip and build time per response from the runtime's
trtpipe_runtime_* counters, CPU cores used per server process), planner vs library defaults, and the
same points measured twice in the lease. Floor: concurrency / decode-step time, step = (weights +
concurrency x (ISL + OSL/2) x KV bytes/token) / the copy bandwidth measured in the same lease.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_h200 import floor  # noqa: E402  (the floor formula of the run itself)

CONFIGS = [("served CB, dispatcher thread (default)", "served-cb"), ("served CB, inline dispatch", "served-cb-inline"),
           ("served CB, engine process", "served-cb-proc"),
           ("in-process CB (same runtime + settings)", "inproc-cb"), ("served static `generate` (baseline)", "served-static"),
           ("served CB, library defaults", "served-defaults"), ("in-process CB, library defaults", "inproc-defaults")]
CONCS = (1, 8, 32, 64, 128)


def ms(x): return "-" if x is None else f"{x * 1000:,.0f} ms"
def sec(x): return "-" if x is None else f"{x:,.1f} s"


def q(s, key, p):
    v = s.get(key) or {}
    return v.get(p) if isinstance(v, dict) and v.get("n") else None


def tput(s): return s["output_token_throughput"]


def counter(deltas, name, **labels):
    """Sum of the counter deltas of family ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, v in deltas.items():
        fam, _, lab = key.partition("{")
        if fam == name and all(f"{k}={val}" in lab for k, val in labels.items()):
            total += v
    return total


PHASES = {"served": "served-cb", "inline": "served-cb-inline", "proc": "served-cb-proc", "inproc": "inproc-cb", "static": "served-static",
          "defaults": "served-defaults", "inproc-defaults": "inproc-defaults"}


def from_results(folder, model):
    """A run assembled from a results/ folder's phase files (a step the session ended before it wrote its
    bench-<tag>.json): <phase>.json, else the <phase>.partial.json the phase keeps up to date per point."""
    run = {"model": model}
    for ph, key in list(PHASES.items()) + [("repos", "repos"), ("bandwidth", "bandwidth")]:
        for name in (f"{ph}.json", f"{ph}.partial.json"):
            f = os.path.join(folder, name)
            if os.path.isfile(f):
                run[key] = json.load(open(f))
                break
    return run


def main(out_dir, extra=()):
    runs = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(out_dir, "bench-*.json")))}
    for spec in extra:  # FOLDER:MODEL
        folder, model = spec.rsplit(":", 1)
        runs[model] = from_results(folder, model)
    bw = next((r["bandwidth"]["read_plus_write_bytes_per_s"] for r in runs.values() if "bandwidth" in r), None)
    by_model = {}
    for tag, r in runs.items():
        m = by_model.setdefault(r.get("model", "llama8b"), {"repos": None, "rows": {}, "points": {}})
        m["repos"] = m["repos"] or r.get("repos")
        for _, key in CONFIGS:
            for p in r.get(key, {}).get("points", []):
                pt = p["point"]
                k = (key, pt["input_len"], pt["output_len"], pt["concurrency"])
                m["rows"].setdefault(k, []).append((tag, p))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "no bandwidth measured")
    for model, m in by_model.items():
        W, KV = m["repos"]["weights_bytes"], m["repos"]["kv_bytes_per_token"]
        print(f"\n## {model}: weights {W / 1e9:.2f} GB, KV {KV:,} B/token\n")
        first = lambda key, *shape_c: (m["rows"].get((key, *shape_c)) or [(None, None)])[0][1]  # noqa: E731
        shapes = sorted({(k[1], k[2]) for k in m["rows"]})
        for shape in shapes:
            print(f"\n### {model} {shape[0]}/{shape[1]}\n")
            print("| config | conc | n | out tok/s | req/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | E2E p99 | floor tok/s | of floor |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for name, key in CONFIGS:
                head = True
                for c in CONCS:
                    p = first(key, *shape, c)
                    if p is None:
                        continue
                    s = p["summary"]
                    fl = floor(W, KV, bw, shape[0], shape[1], c)["tok_s"] if bw else None
                    static = "static" in key
                    print(f"| {name if head else ''} | {c} | {s['requests']['measured']} | {tput(s):,.0f} | "
                          f"{s['request_throughput']:.2f} | {ms(q(s, 'ttft_s', 'p50'))} | {ms(q(s, 'ttft_s', 'p99'))} | "
                          f"{'-' if static else ms(q(s, 'tpot_s', 'p50'))} | {'-' if static else ms(q(s, 'tpot_s', 'p99'))} | "
                          f"{sec(q(s, 'e2e_s', 'p99'))} | {'-' if fl is None else f'{fl:,.0f}'} | "
                          f"{'-' if fl is None else f'{100 * tput(s) / fl:.1f}%'} |")
                    head = False
        print(f"\n### {model}: ratios\n")
        print("| ISL/OSL | conc | served / in-process tok/s (thread) | (inline) | TTFT p50 added (thread) | served CB / static tok/s | CB TTFT p99 vs static | CB E2E p99 vs static |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for shape in shapes:
            for c in CONCS:
                sv, il, ip, st = (first(k, *shape, c) for k in ("served-cb", "served-cb-inline", "inproc-cb", "served-static"))
                if sv is None:
                    continue
                sv, il, ip, st = (x["summary"] if x else None for x in (sv, il, ip, st))
                r1 = f"{tput(sv) / tput(ip):.2f}" if ip else "-"
                r2 = f"{tput(il) / tput(ip):.2f}" if il and ip else "-"
                r3 = f"+{(q(sv, 'ttft_s', 'p50') - q(ip, 'ttft_s', 'p50')) * 1000:,.0f} ms" if ip else "-"
                r4 = f"{tput(sv) / tput(st):.2f}x" if st else "-"
                r5 = f"{ms(q(sv, 'ttft_s', 'p99'))} vs {sec(q(st, 'ttft_s', 'p99'))}" if st else "-"
                r6 = f"{sec(q(sv, 'e2e_s', 'p99'))} vs {sec(q(st, 'e2e_s', 'p99'))}" if st else "-"
                print(f"| {shape[0]}/{shape[1]} | {c} | {r1} | {r2} | {r3} | {r4} | {r5} | {r6} |")
        print(f"\n### {model}: where the served time goes\n")
        print("| config | ISL/OSL | conc | wall s | responses / step | send round trip / response | build / response | "
              "(send + build) / wall | CPU cores: tensorrt_llm stub / tritonserver / postprocessing / preprocessing / engine worker |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for key in ("served-cb", "served-cb-inline", "served-cb-proc"):
            for shape in shapes:
                for c in CONCS:
                    p = first(key, *shape, c)
                    if p is None or "counter_deltas" not in p:
                        continue
                    d, cpu = p["counter_deltas"], p["server_cpu"]
                    n = counter(d, "trtpipe_runtime_total", kind="responses")
                    steps = counter(d, "trtpipe_runtime_total", kind="steps")
                    send = counter(d, "trtpipe_runtime_response_seconds_total", stage="send")
                    build = counter(d, "trtpipe_runtime_response_seconds_total", stage="build")
                    wall = cpu["wall_s"]
                    cores = " / ".join(f"{cpu['cpu_s'].get(k, 0) / wall:.2f}" for k in
                                       ("stub:tensorrt_llm", "tritonserver", "stub:postprocessing", "stub:preprocessing",
                                        "engine_worker"))
                    print(f"| {key} | {shape[0]}/{shape[1]} | {c} | {wall:.1f} | {n / steps if steps else 0:.1f} | "
                          f"{1e3 * send / n if n else 0:.2f} ms | {1e6 * build / n if n else 0:.0f} us | "
                          f"{(send + build) / wall:.0%} | {cores} |")
        pairs = [(k, v) for k, v in m["rows"].items() if k[0] in ("served-defaults",)]
        if pairs:
            print(f"\n### {model}: planner vs library defaults (same bench step)\n")
            print("| ISL/OSL | conc | served: planner / defaults tok/s | in-process: planner / defaults tok/s | TPOT p50 planner / defaults (in-process) |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for (key, isl, osl, c), rows in sorted(pairs):
                tag = rows[0][0]
                pick = lambda k: next((p["summary"] for t, p in m["rows"].get((k, isl, osl, c), []) if t == tag), None)  # noqa: E731
                a, b, i, j = (pick(k) for k in ("served-cb", "served-defaults", "inproc-cb", "inproc-defaults"))
                if not all((a, b, i, j)):
                    continue
                print(f"| {isl}/{osl} | {c} | {tput(a):,.0f} / {tput(b):,.0f} ({tput(a) / tput(b):.2f}x) | "
                      f"{tput(i):,.0f} / {tput(j):,.0f} ({tput(i) / tput(j):.2f}x) | {ms(q(i, 'tpot_s', 'p50'))} / {ms(q(j, 'tpot_s', 'p50'))} |")
        twice = [(k, v) for k, v in sorted(m["rows"].items()) if len(v) > 1]
        if twice:
            print(f"\n### {model}: the same point measured twice in this lease\n")
            print("| config | ISL/OSL | conc | tok/s (bench steps) | spread |")
            print("| --- | --- | ---: | --- | ---: |")
            for (key, isl, osl, c), rows in twice:
                vals = [tput(p["summary"]) for _, p in rows]
                print(f"| {key} | {isl}/{osl} | {c} | {' / '.join(f'{v:,.0f} ({t})' for (t, _), v in zip(rows, vals))} | "
                      f"{100 * (max(vals) - min(vals)) / min(vals):.0f}% |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", sys.argv[2:])
