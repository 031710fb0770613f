"""Bad input: every malformed kind against every model of the default build, the OpenAI frontend's kinds, then the
fuzz loop; a markdown table and (``--json``) the rows.

Starts tritonserver on the default build's repository (generated from this checkout's templates and the built
engine, as tests/test_bad_requests.py does; ``--repo`` serves an existing repository as it is) and the OpenAI
frontend. The kinds, the senders and the fuzz loop are tests/bad_input.py's, the test's own table.

    .venv/bin/python scripts/bench/bench_bad_input.py --fuzz-seconds 60 --json docs/benchmarks/bad_input.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from tests import bad_input as bi  # noqa: E402


def _mark(row: dict) -> str:
    if row["hung"]:
        return "HUNG"
    if row.get("limit"):
        return "limit" + ("" if row["next"] else ", next FAILED")
    flags = [name for name, ok in (("no error", row["error"]), ("field not named", row["field"]),
                                   ("traceback", row["clean"]), ("next FAILED", row["next"])) if not ok]
    return "ok" if not flags else ", ".join(flags)


_NOISE = (r"^\[request id: [^]]*\] ", r"^in ensemble '[^']*', ", r" for (model )?'[^']*'", r" NOTE: Setting .*$",
          r" Please provide all required input\(s\)\.",
          r"^expected (number of inputs between \d+ and \d+|\d+ inputs) but got \d+ inputs\. ")
"""Triton's boilerplate, left out of the table's messages."""


def _short(message: str, n: int = 110) -> str:
    m = message.replace("\n", " ")
    for pattern in _NOISE:
        m = re.sub(pattern, "", m)
    m = m.replace("|", "/")
    return m if len(m) <= n else m[:n - 3] + "..."


def merged(rows: list[dict]) -> list[dict]:
    """One row per (kind, model): the protocols that got the same verdict and message together."""
    out: dict = {}
    for r in rows:
        key = (r["kind"], r["model"], _mark(r), _short(r["message"]))
        if key in out:
            out[key]["protocol"] += "+" + r["protocol"]
        else:
            out[key] = dict(r, verdict=key[2], short=key[3])
    return list(out.values())


def tables(rows: list[dict], openai_rows: list[dict]) -> str:
    models = list(bi.MODELS)
    grid = {(r["kind"], r["model"]): r["verdict"] for r in rows}
    lines = ["| kind | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for kind in bi.KINDS:
        lines.append(f"| {kind} | " + " | ".join(grid.get((kind, m), "-") for m in models) + " |")
    lines += ["", "| kind | model | protocol | error | field named | next ok | message (shortened) |",
              "|---|---|---|---|---|---|---|"]
    for r in rows + openai_rows:
        status = f" {r['status']}" if "status" in r else ""
        error = "yes" if r["error"] else ("no: Triton's limit (see the kind)" if r.get("limit") else "NO")
        message = r["short"] if "short" in r else _short(r["message"])
        lines.append(f"| {r['kind']} | {r['model']} | {r['protocol']}{status} | {error} | "
                     f"{'yes' if r['field'] else 'no'} ({'/'.join(r['fields'])}) | {'yes' if r['next'] else 'NO'} | "
                     f"{message or ('(empty response) ' + _short(r['limit'], 80) if r.get('limit') else '')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "build" / "smollm2-135m" / "cpu" / "engine",
                    help="the built default engine folder (make build-engine)")
    ap.add_argument("--repo", type=Path, default=None, help="serve this repository as it is (default: one generated "
                    "from this checkout's templates)")
    ap.add_argument("--fuzz-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    ctx = bi.Context.load(args.engine)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        srv, fe, server = bi.start_served(args.engine, Path(tmp), args.repo)
        try:
            stubs = bi.stub_processes(srv.proc.pid)
            rows = merged([r for kind, model in bi.cases() for r in bi.run_case(server, ctx, kind, model)])
            openai_rows = [bi.run_openai_case(server, ctx, kind) for kind in bi.OPENAI_KINDS]
            print(tables(rows, openai_rows), flush=True)
            report = bi.fuzz(server, args.fuzz_seconds, seed=args.seed, vocab=ctx.vocab).summary()
            after = {}
            for m in bi.MODELS:  # None: the good request answered right
                rep = bi.send(server, m, ctx.good(m), bi.protocols(m)[0])
                after[m] = rep.error or ctx.answered(m, rep.outputs)
            after["openai"] = bi.good_completion(server, ctx)
            restarted = sorted(stubs - bi.stub_processes(srv.proc.pid))
            trouble = bi.stub_trouble(srv.log_path.read_text(errors="replace"))
        finally:
            fe.stop(10)
            stop = srv.stop()
    wall = time.perf_counter() - t0
    print(f"\nfuzz (seed {args.seed}, {report['seconds']} s): {report['requests']} requests, {report['accepted']} "
          f"answered, {report['errors']} errors, {len(report['hung'])} hung, {len(report['tracebacks'])} "
          f"tracebacks / HTTP 5xx; stub processes restarted: {len(restarted)}; stub trouble in the log: "
          f"{len(trouble)}; good requests afterwards: "
          f"{'all answered' if not any(after.values()) else after}; server stop forced: {stop['forced']}")
    print("\n| model | error kind | count | first message |\n|---|---|---:|---|")
    for key, n in report["by_kind"].items():
        model, kind = key.split(" | ", 1)
        print(f"| {model} | {kind} | {n} | {_short(report['examples'].get(key, ''), 90)} |")
    if args.json:
        out = {"host": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count()},
               "args": {k: str(v) for k, v in vars(args).items()}, "wall_s": round(wall, 1),
               "kinds": len(bi.KINDS), "openai_kinds": len(bi.OPENAI_KINDS),
               "rows": [{k: v for k, v in r.items() if k not in ("short", "next_detail")} for r in rows],
               "openai_rows": openai_rows, "fuzz": report, "after_fuzz": after, "stub_restarts": restarted,
               "stub_trouble": trouble, "stop": stop}
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    failed = [r for r in rows + openai_rows if _mark(r) not in ("ok", "limit")]
    return 1 if failed or report["hung"] or report["tracebacks"] or restarted or trouble or any(after.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
