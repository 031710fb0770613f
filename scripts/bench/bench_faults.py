"""Faults mid-stream: for each fault, how every in-flight request ends (through ensemble, BLS and `tensorrt_llm`),
what keeps running, and how the server stops; a markdown table and (``--json``) the rows.

Faults: kill -9 of the engine worker, of the `tensorrt_llm` stub and of tritonserver, and a stop (`trtpipe stop`'s
terminate_server: drain, then SIGTERM) while three 1,900-token streams generate. "left" counts the processes
running from the repository that no live tritonserver owns any more (pipeline.server_state.left_behind)
``--settle`` seconds after the fault, before anything stops them: the lifeline's work alone; "after stop" counts them, and /dev/shm regions, once the server
was stopped. The server, the streams and the checks are tests/test_faults.py's.

    .venv/bin/python scripts/bench/bench_faults.py --json docs/benchmarks/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from pipeline.server_state import left_behind  # noqa: E402
from tests import test_faults as tf  # noqa: E402
from tests.model_repo.test_serving_options import _start_server  # noqa: E402

FAULTS = ("engine_worker", "tensorrt_llm_stub", "tritonserver", "stop")


def _short(msg: str | None, n: int = 70) -> str:
    if msg is None:
        return "**never ends**"
    m = msg.replace("\n", " ").replace("|", "/")
    return m if len(m) <= n else m[:n - 3] + "..."


def run_fault(fault: str, engine: Path, tmp: Path, end_s: float, settle_s: float) -> dict:
    server = _start_server(engine, tmp / fault)
    repo = server.cfg.model_repository
    regions = tf._regions(server)
    streams = tf._stream_all(server, engine)
    procs = tf._processes(server)
    row = {"fault": fault, "paths": {}}
    stopper, stopped = None, {}
    t0 = time.monotonic()
    if fault == "stop":
        stopper = threading.Thread(target=lambda: stopped.update(server.stop(timeout=60)))
        stopper.start()
    else:
        os.kill((server.proc if fault == "tritonserver" else procs[fault]).pid, signal.SIGKILL)
    waiting = dict(streams)
    while waiting and time.monotonic() < t0 + end_s:  # every path at once: each end timed when it comes
        for path, (client, events) in list(waiting.items()):
            msg = tf._ending(events, time.monotonic() + 0.02)
            if msg is not None:
                row["paths"][path] = {"message": msg, "seconds": round(time.monotonic() - t0, 1)}
                client.stop_stream()  # a client whose request failed closes its stream
                del waiting[path]
    for path in waiting:
        row["paths"][path] = {"message": None, "seconds": None}
    if stopper is None:
        time.sleep(max(0.0, t0 + settle_s - time.monotonic()))
        row["left"] = len(left_behind(repo))
        t1 = time.monotonic()
        stopped = server.stop(timeout=60)
        row["stop_s"] = round(time.monotonic() - t1, 1)
    else:
        stopper.join(120)
        row["left"] = None
        row["stop_s"] = round(time.monotonic() - t0, 1)
    for client, _ in streams.values():
        client.close()
    procs_after, shm_after = tf._leftovers(repo, regions)
    log = server.log_path.read_text(errors="replace")
    row.update(stop=stopped, after_stop={"processes": len(procs_after), "shm": len(shm_after)},
               exit_timeout="Exit timeout expired" in log, segv="Signal (11)" in log)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| fault | ensemble | tensorrt_llm_bls | tensorrt_llm | left before stop | stop | after stop |",
             "|---|---|---|---|---:|---|---|"]
    for r in rows:
        cells = []
        for path in tf.PATHS:
            p = r["paths"][path]
            cells.append(f"{_short(p['message'])}" + (f" ({p['seconds']} s)" if p["seconds"] is not None else ""))
        left = "-" if r["left"] is None else str(r["left"])
        how = "forced" if r["stop"].get("forced") else "clean"
        how += ", exit timeout expired" if r["exit_timeout"] else ""
        how += ", SIGSEGV" if r["segv"] else ""
        lines.append(f"| {r['fault']} | " + " | ".join(cells) + f" | {left} | {r['stop_s']} s, {how} | "
                     f"{r['after_stop']['processes']} processes, {r['after_stop']['shm']} regions |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "build" / "smollm2-135m" / "cpu" / "engine",
                    help="the built default engine folder (make build-engine)")
    ap.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--end-seconds", type=float, default=90.0, help="how long a request may take to end")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the fault before counting processes")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (rows of other faults it holds kept)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fault in args.faults.split(","):
            rows.append(run_fault(fault, args.engine, Path(tmp), args.end_seconds, args.settle))
            print(f"{fault}: done", file=sys.stderr, flush=True)
    if args.json:
        kept = json.loads(args.json.read_text())["rows"] if args.json.is_file() else []
        done = {r["fault"] for r in rows}
        rows = [r for r in kept if r["fault"] not in done] + rows
        rows.sort(key=lambda r: FAULTS.index(r["fault"]))
        out = {"host": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
               "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(table(rows))
    bad = [r for r in rows if r["after_stop"]["processes"] or r["after_stop"]["shm"] or (r["left"] or 0) > 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
