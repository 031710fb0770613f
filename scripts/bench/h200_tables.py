"""Markdown tables of docs/benchmarks/h200.md from one run of scripts/bench/h200_session.sh.

    python3 scripts/bench/h200_tables.py OUT_DIR [RESULTS_DIR:MODEL ...]
      OUT_DIR: the `out/` folder of results.tgz (bench-<tag>.json files); RESULTS_DIR:MODEL: a step's
      results/ folder read phase by phase (for a step the session ended before it finished)

Reads every bench-<tag>.json that bench_h200.py wrote in OUT_DIR (one per `bench` step of the
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
import bench_h200  # noqa: E402
from bench_h200 import floor  # noqa: E402  (the floor formula of the run itself)

CONFIGS = [("served CB, dispatcher thread", "served-cb"), ("served CB, loop in the stub, dispatcher thread", "served-cb-stub"),
           ("served CB, inline dispatch", "served-cb-inline"), ("served CB, engine process", "served-cb-proc"),
           ("served CB, no cuDNN attention", "served-cb-nocudnn"),
           ("served CB, torch's attention choice (cuDNN included)", "served-cb-cudnn"), ("served CB, CUDA graphs", "served-cb-graphs"),
           ("in-process CB (same runtime + settings)", "inproc-cb"), ("in-process CB, no cuDNN attention", "inproc-cb-nocudnn"),
           ("in-process CB, torch's attention choice (cuDNN included)", "inproc-cb-cudnn"),
           ("in-process CB, CUDA graphs", "inproc-cb-graphs"),
           ("in-process CB, started as the served worker (its python + environment)", "inproc-cb-asworker"),
           ("served static `generate` (baseline)", "served-static"),
           ("served CB, library defaults", "served-defaults"), ("in-process CB, library defaults", "inproc-defaults"),
           ("`trtpipe serve`'s OpenAI frontend, /v1/completions (BLS)", "openai-cb")]
SERVED = ("served-cb", "served-cb-stub", "served-cb-inline", "served-cb-proc", "served-cb-nocudnn", "served-cb-cudnn",
          "served-cb-graphs", "openai-cb")
VISIT = ("cold", "warm")  # first visit of a point's shape in its server / process, then later visits
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


def flat_facts(facts):
    """bench_h200.process_facts() -> {name: value} (env.X per variable; pid left out)."""
    out = {}
    for k, v in (facts or {}).items():
        if k == "env":
            out.update({f"env.{n}": x for n, x in v.items()})
        elif k == "libs":
            out["libs"] = ", ".join(v)
        elif k != "pid":
            out[k] = v
    return out


def facts_table(named):
    """Markdown rows of the process facts that differ between the named processes ({label: facts})."""
    flat = {n: flat_facts(f) for n, f in named.items() if f}
    if len(flat) < 2:
        return []
    keys = sorted({k for f in flat.values() for k in f})
    rows = [f"| fact | {' | '.join(flat)} |", "| --- |" + " --- |" * len(flat)]
    for k in keys:
        vals = [str(f.get(k, "-")) for f in flat.values()]
        if len(set(vals)) > 1:
            rows.append(f"| {k} | {' | '.join(v.replace('|', '/') for v in vals)} |")
    if len(rows) == 2:
        rows.append("| (all the same) |" + " |" * len(flat))
    return rows


def served_counts(p):
    """The runtime's counters of one served point over its measured requests: tokens, steps, responses,
    send and build seconds. Reports written before the load tester took its counter snapshot after the
    warm-up (no ``counter_window``; sessions 3-6) counted the warm-up requests too: they ran alone before
    the measured ones, one generation step and one response per token (1 user, sixth session: 381 tokens
    in 381 steps), so their tokens, steps and responses are taken off; send and build seconds stay whole."""
    d = p["counter_deltas"]
    c = {"tokens": counter(d, "trtpipe_runtime_total", kind="tokens"),
         "steps": counter(d, "trtpipe_runtime_total", kind="steps"),
         "responses": counter(d, "trtpipe_runtime_total", kind="responses"),
         "send": counter(d, "trtpipe_runtime_response_seconds_total", stage="send"),
         "build": counter(d, "trtpipe_runtime_response_seconds_total", stage="build")}
    if p.get("counter_window") is None:
        warm = sum(1 for r in p.get("requests", []) if r.get("warmup")) * p["point"]["output_len"]
        for k in ("tokens", "steps", "responses"):
            c[k] = max(c[k] - warm, 0.0)
    return c


PHASES = bench_h200.NAMES  # phase -> results key


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


def label(key, repos):
    """The served default repository's mode, from the parameters the bench recorded for repo-cb."""
    if key != "served-cb":
        return dict((k, n) for n, k in CONFIGS)[key]
    params = (repos or {}).get("repo_tensorrt_llm_params") or {}
    proc = params.get("engine_process", "false") == "true"
    sdpa = params.get("sdpa_backends", "auto")
    return ("served CB, pipeline default: " + ("engine process" if proc else "loop in the stub, dispatcher thread")
            + (", no cuDNN attention" if sdpa not in ("", "auto") and "cudnn" not in sdpa else ""))


def main(out_dir, extra=()):
    runs = {os.path.basename(f)[6:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(out_dir, "bench-*.json")))}
    for spec in extra:  # FOLDER:MODEL
        folder, model = spec.rsplit(":", 1)
        runs[model] = from_results(folder, model)
    bw = next((r["bandwidth"]["read_plus_write_bytes_per_s"] for r in runs.values() if "bandwidth" in r), None)
    by_model = {}
    for tag, r in runs.items():
        m = by_model.setdefault(r.get("model", "llama8b"), {"repos": None, "rows": {}})
        m["repos"] = m["repos"] or r.get("repos")
        for _, key in CONFIGS:
            seen = {}
            for p in r.get(key, {}).get("points", []):
                pt = p["point"]
                k = (key, pt["input_len"], pt["output_len"], pt["concurrency"])
                visit = min(seen.get(k, 0), 1)  # 0 cold: the first visit of this shape in the step's server/process
                seen[k] = seen.get(k, 0) + 1
                m["rows"].setdefault(k, []).append((tag, visit, p))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "no bandwidth measured")
    for model, m in by_model.items():
        W, KV = m["repos"]["weights_bytes"], m["repos"]["kv_bytes_per_token"]
        print(f"\n## {model}: weights {W / 1e9:.2f} GB, KV {KV:,} B/token\n")

        def first(key, isl, osl, c, visit=0):
            """The first measurement of (config, point) at this visit (0 cold, 1 warm), over the bench steps."""
            return next((p for _, v, p in m["rows"].get((key, isl, osl, c), []) if v == visit), None)

        shapes = sorted({(k[1], k[2]) for k in m["rows"]})
        for shape in shapes:
            print(f"\n### {model} {shape[0]}/{shape[1]}\n")
            print("| config | conc | visit | n | out tok/s | req/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | E2E p99 | floor tok/s | of floor |")
            print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for _, key in CONFIGS:
                head = True
                for c in CONCS:
                    for visit in (0, 1):
                        p = first(key, *shape, c, visit)
                        if p is None:
                            continue
                        s = p["summary"]
                        fl = floor(W, KV, bw, shape[0], shape[1], c)["tok_s"] if bw else None
                        static = "static" in key
                        print(f"| {label(key, m['repos']) if head else ''} | {c} | {VISIT[visit]} | {s['requests']['measured']} | "
                              f"{tput(s):,.0f} | {s['request_throughput']:.2f} | {ms(q(s, 'ttft_s', 'p50'))} | "
                              f"{ms(q(s, 'ttft_s', 'p99'))} | {'-' if static else ms(q(s, 'tpot_s', 'p50'))} | "
                              f"{'-' if static else ms(q(s, 'tpot_s', 'p99'))} | {sec(q(s, 'e2e_s', 'p99'))} | "
                              f"{'-' if fl is None else f'{fl:,.0f}'} | {'-' if fl is None else f'{100 * tput(s) / fl:.1f}%'} |")
                        head = False
        served = [k for k in SERVED if any(r[0] == k for r in m["rows"])]
        print(f"\n### {model}: ratios (same visit: cold with cold, warm with warm)\n")
        print("| ISL/OSL | conc | visit | " + " | ".join(f"{label(k, m['repos'])} / in-process tok/s" for k in served) +
              " | TTFT p50 added (default) | served default / static tok/s | default TTFT p99 vs static | default E2E p99 vs static |")
        print("| --- | ---: | --- | " + "---: | " * len(served) + "---: | ---: | ---: | ---: |")
        for shape in shapes:
            for c in CONCS:
                for visit in (0, 1):
                    ip, sv, st = (first(k, *shape, c, visit) for k in ("inproc-cb", "served-cb", "served-static"))
                    cols = [first(k, *shape, c, visit) for k in served]
                    if not any(cols):
                        continue
                    ip, sv, st = (x["summary"] if x else None for x in (ip, sv, st))
                    rs = [f"{tput(x['summary']) / tput(ip):.2f}" if x and ip else "-" for x in cols]
                    r3 = f"+{(q(sv, 'ttft_s', 'p50') - q(ip, 'ttft_s', 'p50')) * 1000:,.0f} ms" if ip and sv else "-"
                    r4 = f"{tput(sv) / tput(st):.2f}x" if st and sv else "-"
                    r5 = f"{ms(q(sv, 'ttft_s', 'p99'))} vs {sec(q(st, 'ttft_s', 'p99'))}" if st and sv else "-"
                    r6 = f"{sec(q(sv, 'e2e_s', 'p99'))} vs {sec(q(st, 'e2e_s', 'p99'))}" if st and sv else "-"
                    print(f"| {shape[0]}/{shape[1]} | {c} | {VISIT[visit]} | {' | '.join(rs)} | {r3} | {r4} | {r5} | {r6} |")
        print(f"\n### {model}: output tokens per generation step (the batch a step carries)\n")
        print("| config | ISL/OSL | conc | visit | tokens / step |")
        print("| --- | --- | ---: | --- | ---: |")
        for key in [k for _, k in CONFIGS if any(r[0] == k for r in m["rows"])]:
            for shape in shapes:
                for c in CONCS:
                    for visit in (0, 1):
                        p = first(key, *shape, c, visit)
                        if p is None:
                            continue
                        if "counter_deltas" in p:  # served: the runtime's counters, measured requests
                            cs = served_counts(p)
                            tok, steps = cs["tokens"], cs["steps"]
                        elif p.get("generation_steps"):  # in-process: the bench counted the deliveries
                            sm = p["summary"]
                            tok = sm["output_tokens_per_request"]["mean"] * sm["requests"]["completed"]
                            steps = p["generation_steps"]
                        else:
                            continue
                        if steps:
                            print(f"| {key} | {shape[0]}/{shape[1]} | {c} | {VISIT[visit]} | {tok / steps:.1f} |")
        named = {}
        for tag, r in runs.items():
            if r.get("model", "llama8b") != model:
                continue
            for key in SERVED:
                if r.get(key, {}).get("process"):
                    named.setdefault(f"{key} (worker)", r[key]["process"])
            for key in ("inproc-cb", "inproc-cb-asworker"):
                if (r.get(key, {}).get("settings") or {}).get("process"):
                    named.setdefault(key, r[key]["settings"]["process"])
        rows = facts_table(named)
        if rows:
            print(f"\n### {model}: the generation process, facts that differ\n")
            print("\n".join(rows))
        print(f"\n### {model}: where the served time goes\n")
        print("| config | ISL/OSL | conc | visit | wall s | responses / step | send round trip / response | build / response | "
              "(send + build) / wall | CPU cores: tensorrt_llm stub / tritonserver / postprocessing / preprocessing / engine worker |")
        print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for key in served:
            for shape in shapes:
                for c in CONCS:
                    for visit in (0, 1):
                        p = first(key, *shape, c, visit)
                        if p is None or "counter_deltas" not in p:
                            continue
                        cpu, cs = p["server_cpu"], served_counts(p)
                        n, steps, send, build = cs["responses"], cs["steps"], cs["send"], cs["build"]
                        wall = cpu["wall_s"]
                        cores = " / ".join(f"{cpu['cpu_s'].get(k, 0) / wall:.2f}" for k in
                                           ("stub:tensorrt_llm", "tritonserver", "stub:postprocessing", "stub:preprocessing",
                                            "engine_worker"))
                        print(f"| {key} | {shape[0]}/{shape[1]} | {c} | {VISIT[visit]} | {wall:.1f} | "
                              f"{n / steps if steps else 0:.1f} | {1e3 * send / n if n else 0:.2f} ms | "
                              f"{1e6 * build / n if n else 0:.0f} us | {(send + build) / wall:.0%} | {cores} |")
        pairs = sorted(k[1:] for k in m["rows"] if k[0] in ("served-defaults", "inproc-defaults"))
        if pairs:
            print(f"\n### {model}: planner vs library defaults (each pair from one bench step, same visit)\n")
            print("| ISL/OSL | conc | served: planner / defaults tok/s | in-process: planner / defaults tok/s |")
            print("| --- | ---: | --- | --- |")
            for isl, osl, c in sorted(set(pairs)):
                cells = []
                for mine, theirs in (("served-cb", "served-defaults"), ("inproc-cb", "inproc-defaults")):
                    got = []
                    for tag, visit, b in m["rows"].get((theirs, isl, osl, c), []):
                        a = next((p for t, v, p in m["rows"].get((mine, isl, osl, c), []) if t == tag and v == visit), None)
                        if a:
                            x, y = tput(a["summary"]), tput(b["summary"])
                            got.append(f"{x:,.0f} / {y:,.0f} ({x / y:.2f}x, {VISIT[visit]})")
                    cells.append("; ".join(got) or "-")
                print(f"| {isl}/{osl} | {c} | {cells[0]} | {cells[1]} |")
        twice = [(k, v) for k, v in sorted(m["rows"].items()) if len(v) > 1]
        if twice:
            print(f"\n### {model}: the same point measured more than once in this lease\n")
            print("| config | ISL/OSL | conc | tok/s (bench step, visit) | spread |")
            print("| --- | --- | ---: | --- | ---: |")
            for (key, isl, osl, c), rows in twice:
                vals = [tput(p["summary"]) for _, _, p in rows]
                print(f"| {key} | {isl}/{osl} | {c} | "
                      f"{' / '.join(f'{v:,.0f} ({t}, {VISIT[vi]})' for (t, vi, _), v in zip(rows, vals))} | "
                      f"{100 * (max(vals) - min(vals)) / min(vals):.0f}% |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", sys.argv[2:])
