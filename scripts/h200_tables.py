"""Markdown tables of docs/benchmarks/h200.md from one run of scripts/h200_session.sh.

    python3 scripts/h200_tables.py RESULTS_DIR    # the `results/` folder of results.tgz ($WORK/results)

Reads served/inproc/static/defaults/inproc-defaults.json (one bench_h200.py phase each), repos.json
(weights and KV bytes per token from the plan) and bandwidth.json; prints the per-point tables, the
serving-overhead and baseline ratios, and planner vs library defaults. Floor: concurrency / decode-step
time, step = (weights + concurrency x (ISL + OSL/2) x KV bytes/token) / measured copy bandwidth.
"""
import json
import os
import sys

os.chdir(sys.argv[1] if len(sys.argv) > 1 else ".")
def load(f): return json.load(open(f))
bw = load("bandwidth.json")["read_plus_write_bytes_per_s"]
repos = load("repos.json")
W, KV = repos["weights_bytes"], repos["kv_bytes_per_token"]
def floor(isl, osl, c):
    return c / ((W + c * (isl + osl / 2) * KV) / bw)
rows = {}
order = [("served CB (the pipeline)", "served.json"), ("in-process CB (same runtime + settings)", "inproc.json"),
         ("served static `generate` (baseline)", "static.json"),
         ("served CB, library defaults", "defaults.json"), ("in-process CB, library defaults", "inproc-defaults.json")]
for name, f in order:
    for p in load(f)["points"]:
        pt = p["point"]
        rows[(name, pt["input_len"], pt["output_len"], pt["concurrency"])] = p["summary"]
def ms(x): return "-" if x is None else f"{x*1000:,.0f} ms"
def s_(x): return "-" if x is None else f"{x:,.1f} s"
def q(s, k, p):
    v = s.get(k) or {}
    return v.get(p) if isinstance(v, dict) and v.get("n") else None
for shape in ((128, 128), (467, 256)):
    print(f"\n### {shape[0]}/{shape[1]}\n")
    print("| config | conc | n | out tok/s | req/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | E2E p99 | floor tok/s | of floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _ in order:
        first = True
        for c in (1, 8, 32, 64, 128):
            s = rows.get((name, *shape, c))
            if s is None: continue
            fl = floor(*shape, c); tp = s["output_token_throughput"]
            static = "static" in name
            print(f"| {name if first else ''} | {c} | {s['requests']['measured']} | {tp:,.0f} | {s['request_throughput']:.2f} | {ms(q(s,'ttft_s','p50'))} | {ms(q(s,'ttft_s','p99'))} | "
                  f"{'-' if static else ms(q(s,'tpot_s','p50'))} | {'-' if static else ms(q(s,'tpot_s','p99'))} | {s_(q(s,'e2e_s','p99'))} | {fl:,.0f} | {100*tp/fl:.1f}% |")
            first = False
print("\n### ratios\n")
print("| ISL/OSL | conc | served / in-process tok/s | TTFT p50 added by serving | served CB / static tok/s | CB TTFT p99 vs static | CB E2E p99 vs static |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for shape in ((128, 128), (467, 256)):
    for c in (1, 8, 32, 64, 128):
        sv = rows.get(("served CB (the pipeline)", *shape, c)); ip = rows.get(("in-process CB (same runtime + settings)", *shape, c))
        st = rows.get(("served static `generate` (baseline)", *shape, c))
        r1 = f"{sv['output_token_throughput']/ip['output_token_throughput']:.2f} (-{100*(1-sv['output_token_throughput']/ip['output_token_throughput']):.0f}%)"
        r2 = f"+{(q(sv,'ttft_s','p50')-q(ip,'ttft_s','p50'))*1000:,.0f} ms"
        r3 = f"{sv['output_token_throughput']/st['output_token_throughput']:.2f}x" if st else "-"
        r4 = f"{ms(q(sv,'ttft_s','p99'))} vs {s_(q(st,'ttft_s','p99'))}" if st else "-"
        r5 = f"{s_(q(sv,'e2e_s','p99'))} vs {s_(q(st,'e2e_s','p99'))}" if st else "-"
        print(f"| {shape[0]}/{shape[1]} | {c} | {r1} | {r2} | {r3} | {r4} | {r5} |")
print("\n### planner vs library defaults\n")
print("| ISL/OSL | conc | served: planner / defaults tok/s | in-process: planner / defaults tok/s | TPOT p50 planner / defaults (in-process) |")
print("| --- | ---: | ---: | ---: | ---: |")
for shape, c in (((128, 128), 32), ((128, 128), 128), ((467, 256), 32)):
    a = rows[("served CB (the pipeline)", *shape, c)]; b = rows[("served CB, library defaults", *shape, c)]
    i = rows[("in-process CB (same runtime + settings)", *shape, c)]; j = rows[("in-process CB, library defaults", *shape, c)]
    print(f"| {shape[0]}/{shape[1]} | {c} | {a['output_token_throughput']:,.0f} / {b['output_token_throughput']:,.0f} ({a['output_token_throughput']/b['output_token_throughput']:.2f}x) | "
          f"{i['output_token_throughput']:,.0f} / {j['output_token_throughput']:,.0f} ({i['output_token_throughput']/j['output_token_throughput']:.2f}x) | {ms(q(i,'tpot_s','p50'))} / {ms(q(j,'tpot_s','p50'))} |")
print(f"\nbandwidth {bw/1e12:.2f} TB/s; weights {W/1e9:.2f} GB; KV {KV} B/token")
