"""Where the served `tensorrt_llm` model's Python-backend stub (or its engine worker) spends its time, under load.

    python scripts/bench/profile_stub.py REPO ENGINE --points 128/128:1,32 [--seconds 12] [--py-spy PATH]
                                         [--process stub|worker] [--inproc]

Starts tritonserver on REPO (a repository from `trtpipe build` or bench_h200.py's `repos` phase), runs a closed
loop at each point with `trtpipe loadtest`'s runner, and while it runs records the tensorrt_llm stub
(or its engine worker) with py-spy three times: all samples (where each thread is), `--gil` samples
(which thread holds the GIL) and `--native` samples (C/C++ frames too: kernel launches, the CUDA
driver). `--inproc` records the same runtime called in-process (no Triton) the same way, from the
first measured request on. Prints, per point and thread, the share of samples and the top frames,
and writes profile.json + the raw py-spy files to --out (docs/benchmarks/h200.md, serving overhead).

py-spy: https://github.com/benfred/py-spy (sampling profiler; `record --threads --gil -f raw`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent  # scripts/bench
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts


def stub_pid(model: str = "tensorrt_llm") -> str:
    """PID of the stub serving ``model`` (its command line names <repo>/<model>/1/model.py)."""
    out = subprocess.run(["pgrep", "-af", "triton_python_backend_stub"], capture_output=True, text=True).stdout
    pids = [line.split()[0] for line in out.splitlines() if f"/{model}/1/model.py" in line]
    if not pids:
        raise SystemExit(f"no Python-backend stub for {model} found")
    return pids[0]


def worker_pid(stub: str) -> str:
    """PID of the engine worker (engine_process true: tensorrt_llm/1/engine_worker.py, a child of the stub)."""
    import psutil

    for child in psutil.Process(int(stub)).children(recursive=True):
        if any(arg.endswith("engine_worker.py") for arg in child.cmdline()):
            return str(child.pid)
    raise SystemExit(f"no engine worker under stub {stub}: is engine_process false in this repository?")


RECORDINGS = (("all", ["-r", "200", "--nonblocking"]), ("gil", ["-r", "200", "--nonblocking", "--gil"]),
              ("native", ["-r", "100", "--native"]))  # py-spy cannot take native stacks without pausing the process


def record(py_spy: str, pid: str, seconds: int, out: Path, tag: str, entry: dict) -> None:
    """The three py-spy recordings of ``pid``, summarized into ``entry[kind]``."""
    for kind, extra in RECORDINGS:
        raw = out / f"spy-{tag}-{kind}.txt"
        subprocess.run([py_spy, "record", "-p", pid, "-d", str(seconds), "--threads", "-f", "raw", "-o", str(raw),
                        *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        entry[kind] = summarize(raw) if raw.is_file() and raw.stat().st_size else {"error": "no samples"}


def summarize(raw: Path, top: int = 12) -> dict:
    """py-spy raw (collapsed stacks 'thread;frame;...;frame count') -> samples per thread and top leaves."""
    threads, leaves = Counter(), Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1]
        threads[name] += int(n)
        leaves[f"{name} | {frames[-1]}"] += int(n)
    total = sum(threads.values()) or 1
    return {"samples": total, "threads": {k: round(v / total, 3) for k, v in threads.most_common()},
            "top_frames": [(k, round(v / total, 3)) for k, v in leaves.most_common(top)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("engine", type=Path, help="engine folder (its tokenizer makes the prompts)")
    ap.add_argument("--points", default="128/128:1,32")
    ap.add_argument("--seconds", type=int, default=12, help="py-spy duration per recording (three recordings)")
    ap.add_argument("--waves", type=int, default=6,
                    help="requests per point = waves x concurrency (enough to outlast the recordings)")
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("--python-path", default="", help="TRTPIPE_PYTHONPATH for the stub")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "build/profile"))
    ap.add_argument("--process", choices=("stub", "worker"), default="stub",
                    help="whom py-spy records: the tensorrt_llm stub, or its engine worker (engine_process true)")
    ap.add_argument("--inproc", action="store_true",
                    help="profile the same runtime called in-process (bench_h200.py inproc), no Triton")
    a = ap.parse_args(argv)
    if a.inproc:
        return _inproc(a)

    from pipeline.loadtest.api import run_loadtest
    from pipeline.loadtest.config import LoadTestConfig
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    a.out.mkdir(parents=True, exist_ok=True)
    ports = free_ports(3)
    cfg = ServerConfig(model_repository=a.repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                       python_path=[p for p in a.python_path.split(os.pathsep) if p] or None,
                       log_file=a.out / "server.log", ready_timeout_s=900)
    report = []
    with TritonServer(cfg):
        pid = stub_pid()
        pid = worker_pid(pid) if a.process == "worker" else pid
        for spec in a.points.split(";"):
            shape, concs = spec.split(":")
            isl, osl = shape.split("/")
            for conc in (int(c) for c in concs.split(",")):
                tag = f"{isl}-{osl}-c{conc}"
                n = max(conc * a.waves, 6)  # enough to outlast the recordings
                lt = LoadTestConfig(url=cfg.grpc_url, concurrency=[conc], num_requests=n, warmup=0, input_len=isl,
                                    output_len=osl, tokenizer_dir=a.engine, fixed_output="ignore_eos", seed=11,
                                    request_timeout_s=300, drain_timeout_s=300)
                res: dict = {}
                t = threading.Thread(target=lambda: res.update(run_loadtest(lt)), daemon=True)
                t.start()
                time.sleep(4)  # past the first prefill
                entry = {"point": tag, "process": a.process, "pid": pid}
                record(a.py_spy, pid, a.seconds, a.out, tag, entry)
                t.join()
                if res.get("points"):
                    entry["output_token_throughput"] = res["points"][0]["summary"].get("output_token_throughput")
                report.append(entry)
                print(json.dumps(entry, indent=1), flush=True)
    (a.out / "profile.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _inproc(a) -> int:
    """The in-process comparison: bench_h200.inproc() at each point, py-spy on this very process."""
    import torch

    sys.path.insert(0, str(HERE))
    import bench_h200

    a.out.mkdir(parents=True, exist_ok=True)
    report = []
    for spec in a.points.split(";"):
        shape, concs = spec.split(":")
        isl, osl = (int(x) for x in shape.split("/"))
        for conc in (int(c) for c in concs.split(",")):
            tag = f"inproc-{isl}-{osl}-c{conc}"
            entry = {"point": tag, "process": "inproc", "pid": str(os.getpid())}
            measuring = threading.Event()
            t = threading.Thread(target=lambda: (measuring.wait(), record(a.py_spy, str(os.getpid()), a.seconds,
                                                                         a.out, tag, entry)), daemon=True)
            t.start()
            res = bench_h200.inproc(a.engine, a.repo, "cuda" if torch.cuda.is_available() else "cpu",
                                    "bfloat16" if torch.cuda.is_available() else "float32",
                                    [(isl, osl, conc, max(a.waves * conc, 8))], seed=11, warmup=1,
                                    on_measure=measuring.set)
            t.join()
            entry["output_token_throughput"] = res["points"][0]["summary"].get("output_token_throughput")
            report.append(entry)
            print(json.dumps(entry, indent=1), flush=True)
    (a.out / "profile-inproc.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
