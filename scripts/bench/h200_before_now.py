"""The short grid of docs/benchmarks/h200.md, before (the committed result) and now, point by point.

    python3 scripts/bench/h200_before_now.py NOW [--before-served F] [--before-inproc F]
      NOW: a bench-<tag>.json, or a results/ folder (served.json, inproc.json, openai.json or their .partial.json)
      before: session 7 lease A's raw reports beside the page (the committed current result), by default

Per point (the first visit of its shape, as the committed table): served (gRPC ensemble) and in-process output
tok/s, their ratio, TTFT p99 of each, and the OpenAI frontend's tok/s and TTFT p99 where NOW has them;
"now / before" for every pair.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "docs" / "benchmarks" / "h200"


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def _points(run: dict | None) -> dict:
    """(isl, osl, conc) -> summary of the first visit."""
    out = {}
    for p in (run or {}).get("points", []):
        pt = p["point"]
        out.setdefault((pt["input_len"], pt["output_len"], pt["concurrency"]), p["summary"])
    return out


def _now(path: Path) -> dict:
    if path.is_file():
        r = _load(path)
        return {k: r.get(f"{k}-cb") for k in ("served", "inproc", "openai")}
    out = {}
    for k in ("served", "inproc", "openai"):
        f = next((path / n for n in (f"{k}.json", f"{k}.partial.json") if (path / n).is_file()), None)
        out[k] = _load(f) if f else None
    return out


def _tok(s): return None if s is None else s["output_token_throughput"]
def _p99(s): return None if s is None else (s.get("ttft_s") or {}).get("p99")
def _r(a, b): return "-" if a is None or b is None or not b else f"{a / b:.2f}"
def _n(x): return "-" if x is None else f"{x:,.0f}"
def _ms(x): return "-" if x is None else f"{x * 1e3:,.0f}"


def table(before: dict, now: dict) -> str:
    bs, bi = _points(before["served"]), _points(before["inproc"])
    ns, ni, no = _points(now["served"]), _points(now["inproc"]), _points(now["openai"])
    rows = ["| ISL/OSL | users | served tok/s before / now (now/before) | in-process tok/s before / now (now/before) "
            "| served / in-process before / now | served TTFT p99 ms before / now | in-process TTFT p99 ms before / now "
            "| OpenAI tok/s now (/ served now) | OpenAI TTFT p99 ms now |",
            "| --- | ---: | --- | --- | --- | --- | --- | --- | ---: |"]
    for key in sorted(set(ns) | set(ni) | set(no)):
        isl, osl, c = key
        b_s, b_i, n_s, n_i, n_o = (d.get(key) for d in (bs, bi, ns, ni, no))
        rows.append(
            f"| {isl}/{osl} | {c} | {_n(_tok(b_s))} / {_n(_tok(n_s))} ({_r(_tok(n_s), _tok(b_s))}) "
            f"| {_n(_tok(b_i))} / {_n(_tok(n_i))} ({_r(_tok(n_i), _tok(b_i))}) "
            f"| {_r(_tok(b_s), _tok(b_i))} / {_r(_tok(n_s), _tok(n_i))} "
            f"| {_ms(_p99(b_s))} / {_ms(_p99(n_s))} | {_ms(_p99(b_i))} / {_ms(_p99(n_i))} "
            f"| {_n(_tok(n_o))} ({_r(_tok(n_o), _tok(n_s))}) | {_ms(_p99(n_o))} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("now", type=Path)
    ap.add_argument("--before-served", type=Path, default=RAW / "session7-a-served.json.gz")
    ap.add_argument("--before-inproc", type=Path, default=RAW / "session7-a-inproc.partial.json.gz")
    a = ap.parse_args(argv)
    before = {"served": _load(a.before_served), "inproc": _load(a.before_inproc)}
    print(table(before, _now(a.now)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
