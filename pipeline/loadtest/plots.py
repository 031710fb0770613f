"""PNG plots of a report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _label(p: dict) -> str:
    pt = p["point"]
    return f"concurrency {pt['concurrency']}" if pt["mode"] == "closed" else f"rate {pt['rate']:g}/s"


def write_plots(report: dict, out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = report["points"]
    paths = {}

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    xs = [p["summary"]["output_token_throughput"] or 0 for p in points]
    for key, name, axis in (("ttft_s", "TTFT", ax[0]), ("e2e_s", "E2E", ax[1])):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ys = [p["summary"][key][q] for p in points]
            axis.plot(xs, [np.nan if y is None else y for y in ys], style, label=f"{name} {q}")
        for x, p in zip(xs, points):
            axis.annotate(_label(p).split()[-1], (x, p["summary"][key]["p50"] or 0), fontsize=7)
        axis.set_xlabel("output tokens/s")
        axis.set_ylabel(f"{name} (s)")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle("throughput vs latency over the sweep (labels: load)")
    fig.tight_layout()
    paths["throughput_latency"] = out_dir / "throughput_latency.png"
    fig.savefig(paths["throughput_latency"], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for p in points:
        ok = [r for r in p["requests"] if not r["warmup"] and r["error_kind"] is None and r["ttft"] is not None]
        ttft = [r["ttft"] * 1e3 for r in ok]
        itl = [(b - a) * 1e3 for r in ok for a, b in zip(*_token_times(r))]
        if ttft:
            ax[0].hist(ttft, bins=30, alpha=0.5, label=_label(p))
        if itl:
            ax[1].hist(itl, bins=50, alpha=0.5, label=_label(p))
    ax[0].set_xlabel("TTFT (ms)")
    ax[1].set_xlabel("ITL, pooled over requests (ms)")
    for a in ax:
        a.set_ylabel("count")
        a.legend(fontsize=7)
    fig.tight_layout()
    paths["latency_distributions"] = out_dir / "ttft_itl.png"
    fig.savefig(paths["latency_distributions"], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    for p in points:
        t = [x for r in p["requests"] if not r["warmup"] for x, n in zip(r["response_times"], r["response_tokens"])
             for _ in range(n)]
        if t:
            width = max(max(t) / 40, 0.05)
            bins = np.arange(0, max(t) + width, width)
            counts, edges = np.histogram(t, bins=bins)
            ax.plot(edges[:-1], counts / width, label=_label(p))
    ax.set_xlabel("seconds since the first scheduled send")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths["tokens_over_time"] = out_dir / "tokens_over_time.png"
    fig.savefig(paths["tokens_over_time"], dpi=100)
    plt.close(fig)
    return paths


def _token_times(r: dict) -> tuple[list, list]:
    tt = [t for t, n in zip(r["response_times"], r["response_tokens"]) if n > 0]
    return tt[:-1], tt[1:]
