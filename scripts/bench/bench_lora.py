"""LoRA adapters on the portable runtime: the cost of mixing adapters in one batch, and of loading them.

Makes four PEFT LoRA adapters of the embedded SmolLM2-135M-Instruct with peft's own API (rank 16 on q, k, v and o
projections, random non-zero weights), builds them into one build (``lora.adapters``; int4_rtn: the portable runtime
dequantizes every recipe into the same float weights, so the quantization does not change its speed), serves it
with tritonserver and runs `trtpipe loadtest` (Triton gRPC ensemble, closed loop, fixed output length) at one
concurrency for each model set: the base alone, one adapter, two and four adapters spread round-robin (``--models``,
so every batch mixes them) and the base with four adapters, in ``--rounds`` interleaved rounds (a drift of the
machine hits every set alike). Prints a markdown table: each set's median over the rounds of output-token
throughput, TPOT p50 (with the rounds' range) and TTFT p50, against the base alone.

Time to the first request of an adapter: the portable runtime loads every adapter of the build with the model
(there is no lazy load), so what is measured is (a) the server's start to ready with the four adapters against the
same engine without them (a copy of the repository whose engine folder has no lora/), and (b) the TTFT of each
adapter's first request right after the server is ready against the median of the same request three more times.

    .venv/bin/python scripts/bench/bench_lora.py --json docs/benchmarks/lora.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from pipeline.loadtest.api import run_loadtest  # noqa: E402
from pipeline.loadtest.config import LoadTestConfig  # noqa: E402
from pipeline.loadtest.selfcheck import serve_repository  # noqa: E402
from tests.conftest import make_peft_adapter  # noqa: E402

NAME = "bench-lora"
ADAPTERS = ("a1", "a2", "a3", "a4")
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]


def build(out_root: Path) -> tuple:
    """The build with four adapters (made once into ``out_root/adapters``); returns (resolved build, its folder)."""
    from builders.layout import build_dir
    from builders.model_fetch import resolve_source
    from builders.spec import load_spec
    from pipeline.build import run_build

    base = resolve_source("embedded:smollm2-135m-instruct")
    for i, name in enumerate(ADAPTERS):
        if not (out_root / "adapters" / name / "adapter_model.safetensors").is_file():
            make_peft_adapter(base, out_root / "adapters" / name, r=16, modules=MODULES, seed=100 + i)
    spec = out_root / f"{NAME}.yaml"
    spec.write_text(f"name: {NAME}\n"
                    "quantization: {quant_algo: int4_rtn, group_size: 64, calibration: {num_samples: 2, seq_len: 64}}\n"
                    "gates: {eval_samples: 2, eval_seq_len: 128}\n"
                    "lora:\n  adapters:\n" + "".join(f"    {n}: ./adapters/{n}\n" for n in ADAPTERS))
    resolved = load_spec(spec, "cpu")
    run_build(resolved, out_root=out_root / "build", progress=False)
    return resolved, build_dir(resolved, out_root / "build")


def repo_without_adapters(src: Path, engine: Path, dst: Path) -> Path:
    """A copy of repository ``src`` whose tensorrt_llm model serves a copy of ``engine`` without lora/ (files
    linked, not copied): the same model and settings, no adapters."""
    bare = dst / "engine"
    shutil.copytree(engine, bare, copy_function=os.link, ignore=shutil.ignore_patterns("lora"))
    repo = dst / "model_repo"
    shutil.copytree(src, repo, symlinks=True)
    cfg = repo / "tensorrt_llm" / "config.pbtxt"
    text, n = re.subn(r'(key: "gpt_model_path" value: \{ string_value: ")([^"]+)(")',
                      lambda m: m.group(1) + str(bare) + m.group(3), cfg.read_text())
    if n != 1:
        raise SystemExit(f"{cfg}: no gpt_model_path parameter")
    cfg.write_text(text)
    return repo


def timed_start(repo: Path, log_dir: Path):
    """serve_repository with its start-to-ready seconds."""
    t0 = time.perf_counter()
    ctx = serve_repository(repo, log_dir=log_dir)
    urls = ctx.__enter__()
    return ctx, urls, time.perf_counter() - t0


def print_tables(rows: list, load: dict, sets: dict, args) -> None:
    """The markdown tables of one run (its rows and load figures, as the JSON keeps them)."""
    first, steady = load["first_request_ttft_s"], load["steady_ttft_s"]

    def med(label, key):
        return statistics.median(r[key] for r in rows if r["set"] == label)

    def spread(label, key):
        vals = [r[key] for r in rows if r["set"] == label]
        return (f"{min(vals) * 1e3:.0f}-{max(vals) * 1e3:.0f}" if key in ("tpot_p50_s", "ttft_p50_s")
                else f"{min(vals):.1f}-{max(vals):.1f}")

    print(f"\nconcurrency {args.concurrency}, {args.num_requests} requests per set and round, {args.rounds} rounds "
          f"(sets interleaved), input {args.input_len} / output {args.output_len} tokens (fixed), Triton gRPC ensemble, "
          "closed loop; medians over the rounds\n")
    print("| models in the batch | output tok/s | (rounds) | TPOT p50 ms | (rounds) | TTFT p50 ms | throughput vs base | "
          "TPOT vs base | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label in sets:
        print(f"| {label} | {med(label, 'out_tok_s'):.1f} | {spread(label, 'out_tok_s')} | "
              f"{med(label, 'tpot_p50_s') * 1e3:.1f} | {spread(label, 'tpot_p50_s')} | "
              f"{med(label, 'ttft_p50_s') * 1e3:.0f} | "
              f"{100 * (med(label, 'out_tok_s') / med('base', 'out_tok_s') - 1):+.1f}% | "
              f"{100 * (med(label, 'tpot_p50_s') / med('base', 'tpot_p50_s') - 1):+.1f}% | "
              f"{sum(r['failed'] for r in rows if r['set'] == label)} |")
    print(f"\nstart to ready: {load['ready_s_without_adapters']:.1f} s without adapters, "
          f"{load['ready_s_with_4_adapters']:.1f} s with 4")
    print("| adapter | first request TTFT ms | steady TTFT p50 ms |")
    print("|---|---|---|")
    for name in ADAPTERS:
        print(f"| {name} | {first[name] * 1e3:.0f} | {steady[name] * 1e3:.0f} |")
    print(f"\nmedian first/steady TTFT ratio: {statistics.median(first[n] / steady[n] for n in ADAPTERS):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench-lora", help="adapters and build go here")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-requests", type=int, default=16, help="requests per set and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every set, interleaved")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tables-from", type=Path, default=None, help="print the tables of a saved --json and stop")
    args = ap.parse_args()
    if args.tables_from:
        saved = json.loads(args.tables_from.read_text())
        for k, v in saved["args"].items():
            setattr(args, k, v)
        sets = {r["set"]: r["models"] for r in saved["rows"]}
        print_tables(saved["rows"], saved["load"], sets, args)
        return 0
    resolved, folder = build(args.out)
    task_ids = {a["name"]: a["task_id"] for a in json.loads((folder / "plan.json").read_text())["lora"]["adapters"]}
    task_ids[NAME] = 0
    sets = {"base": [NAME], "1 adapter": ["a1"], "2 adapters": ["a1", "a2"], "4 adapters": list(ADAPTERS),
            "base + 4 adapters": [NAME, *ADAPTERS]}
    rows, load = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        bare = repo_without_adapters(folder / "model_repo", folder / "engine", Path(tmp))
        ctx, _, load["ready_s_without_adapters"] = timed_start(bare, Path(tmp))
        ctx.__exit__(None, None, None)
        ctx, (grpc, metrics), load["ready_s_with_4_adapters"] = timed_start(folder / "model_repo", Path(tmp))
        try:
            def run(models, n, warmup):
                cfg = LoadTestConfig(url=grpc, metrics_url=metrics, mode="closed", concurrency=[args.concurrency],
                                     num_requests=n, warmup=warmup, input_len=str(args.input_len),
                                     output_len=str(args.output_len), fixed_output="ignore_eos",
                                     tokenizer_dir=folder / "engine", models=models, lora_task_ids=task_ids, seed=7)
                return run_loadtest(cfg)["points"][0]

            # first request of each adapter after ready, one at a time, then the same again (steady)
            first = {}
            for name in ADAPTERS:
                s = run([name], 1, 0)["summary"]
                first[name] = s["ttft_s"]["p50"]
            steady = {name: statistics.median(run([name], 1, 0)["summary"]["ttft_s"]["p50"] for _ in range(3))
                      for name in ADAPTERS}  # the same single request, three more times each
            load["first_request_ttft_s"] = first
            load["steady_ttft_s"] = steady
            for round_ in range(args.rounds):  # interleaved: a drift of the machine hits every set alike
                for label, models in sets.items():
                    p = run(models, args.num_requests, args.concurrency)
                    s = p["summary"]
                    rows.append({"round": round_, "set": label, "models": models, "req_s": s["request_throughput"],
                                 "out_tok_s": s["output_token_throughput"], "ttft_p50_s": s["ttft_s"]["p50"],
                                 "tpot_p50_s": s["tpot_s"]["p50"], "failed": s["requests"]["failed"],
                                 "valid": p["validity"]["valid"]})
                    print(f"round {round_} {label}: {s['output_token_throughput']:.1f} tok/s, TPOT p50 "
                          f"{s['tpot_s']['p50'] * 1e3:.1f} ms", flush=True)
        finally:
            ctx.__exit__(None, None, None)

    print_tables(rows, load, sets, args)
    if args.json:
        args.json.write_text(json.dumps({
            "host": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": rows, "load": load}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
