"""Run NVIDIA aiconfigurator's performance model for a batch of points: the process side of builders/perf_model.py.

aiconfigurator 0.12 needs numpy >= 2.1 and the pipeline's environment pins numpy < 2 (the Triton Python
backend), so this file runs in aiconfigurator's own interpreter (``.aiconfigurator/bin/python``, made by
``make setup``) and imports nothing from the project: only the standard library and aiconfigurator.

Protocol: one JSON object on stdin, JSON lines on stdout (one per point, in order, so the caller can show
progress); everything aiconfigurator prints goes to stderr.

- ``{"op": "info"}`` -> ``{"aiconfigurator": version, "architectures": {...}, "systems": {system: {backend:
  version}}, "gemm_quant_modes": [...], "moe_quant_modes": [...]}``: the library's version, the HF architectures it
  models, each system's default database version and its quantization mode names.
- ``{"op": "estimate", "points": [point, ...]}`` -> one line per point. A point holds ``id``, ``model_dir`` (a
  folder with config.json), ``system``, ``backend`` and the keyword arguments of
  ``aiconfigurator.cli.api.cli_estimate`` (mode agg): isl, osl, batch_size, ctx_tokens, tp_size, pp_size,
  moe_tp_size, moe_ep_size, gemm_quant_mode, kvcache_quant_mode, moe_quant_mode, free_gpu_memory_fraction,
  max_seq_len. The answer is ``{"id", "ok": true, "ttft_ms", "tpot_ms", ...}`` or ``{"id", "ok": false, "error"}``.
- ``{"op": "default", "model_dir", "system", "backend", "total_gpus", "isl", "osl", "ttft_ms", "tpot_ms"}`` ->
  the aggregated configurations aiconfigurator's own ``cli_default`` picks, best first.

Database modes (aiconfigurator ``PerfDatabase``): SILICON answers from measured kernel tables only and raises
where a table lacks the shape; the point is then retried in HYBRID (measured where present, empirical /
speed-of-light formulas elsewhere) and says so.
"""

from __future__ import annotations

import json
import logging
import sys

_RESULT_KEYS = {  # our name: aiconfigurator's result-dict key (InferenceSummary.get_result_dict)
    "ttft_ms": "ttft", "tpot_ms": "tpot", "request_latency_ms": "request_latency", "tokens_per_s": "tokens/s",
    "tokens_per_s_per_gpu": "tokens/s/gpu", "tokens_per_s_per_user": "tokens/s/user", "seq_per_s": "seq/s",
    "concurrency": "concurrency", "memory_gib": "memory", "num_gpus": "num_total_gpus",
}
_ESTIMATE_ARGS = ("isl", "osl", "batch_size", "ctx_tokens", "tp_size", "pp_size", "moe_tp_size", "moe_ep_size",
                  "gemm_quant_mode", "kvcache_quant_mode", "moe_quant_mode", "free_gpu_memory_fraction",
                  "max_seq_len")


def _fast_yaml() -> None:
    """aiconfigurator reads hundreds of YAML files with yaml.safe_load; libyaml's loader reads them ~8x faster."""
    import yaml

    if getattr(yaml, "__with_libyaml__", False):
        yaml.SafeLoader = yaml.CSafeLoader


MEASURED_TAGS = ("silicon", "estimated")
"""aiconfigurator's per-operation source tags that come from measured tables: ``silicon`` (a table row) and
``estimated`` (modeled from measured components); ``empirical`` and ``sol`` are formulas, ``mixed`` a sum of both."""


def _short(e: Exception) -> str:
    """The error's first clause, without the library's file paths and lane lists."""
    msg = f"{type(e).__name__}: {e}".splitlines()[0]
    for cut in (": tried lane_order", " at /"):
        msg = msg.split(cut)[0]
    return msg[:240]


def _silicon_share(data: dict | None, source: dict | None) -> float | None:
    """Latency-weighted share of operations answered from measured tables (:data:`MEASURED_TAGS`)."""
    if not data or not source:
        return None
    total = silicon = 0.0
    for step, ops in data.items():
        tags = source.get(step) or {}
        if not isinstance(ops, dict):
            continue
        for op, latency in ops.items():
            if not isinstance(latency, (int, float)) or op not in tags:
                continue
            total += latency
            silicon += latency if tags[op] in MEASURED_TAGS else 0.0
    return round(silicon / total, 4) if total > 0 else None


class _Versions:
    def __init__(self):
        self._cache: dict[tuple[str, str], str | None] = {}

    def get(self, system: str, backend: str) -> str | None:
        from aiconfigurator.sdk.perf_database import get_latest_database_version

        key = (system, backend)
        if key not in self._cache:
            self._cache[key] = get_latest_database_version(system=system, backend=backend)
        return self._cache[key]


def estimate(point: dict, versions: _Versions) -> dict:
    """One point through ``cli_estimate`` (SILICON, then HYBRID where a measured table is missing)."""
    from aiconfigurator.cli.api import cli_estimate

    out = {"id": point.get("id")}
    version = point.get("backend_version") or versions.get(point["system"], point["backend"])
    if version is None:
        return {**out, "ok": False, "error": f"aiconfigurator has no {point['backend']} database for system "
                                             f"{point['system']}"}
    kwargs = {k: point[k] for k in _ESTIMATE_ARGS if point.get(k) is not None}
    first_error = None
    for mode in ("SILICON", "HYBRID"):
        try:
            r = cli_estimate(point["model_dir"], point["system"], mode="agg", backend_name=point["backend"],
                             backend_version=version, database_mode=mode, **kwargs)
        except Exception as e:  # the library raises ValueError, RuntimeError (OOM) and its own errors
            msg = _short(e).replace(f"'{point['model_dir']}'", "the model")
            if "OOM" in msg or mode == "HYBRID":
                return {**out, "ok": False, "error": first_error or msg, "backend_version": version}
            first_error = msg
            continue
        res = {ours: r.raw.get(theirs) for ours, theirs in _RESULT_KEYS.items()}
        return {**out, "ok": True, **res, "backend": point["backend"], "backend_version": version,
                "database_mode": mode, "silicon_share": _silicon_share(r.per_ops_data, r.per_ops_source),
                "kv_cache_warning": r.kv_cache_warning, "silicon_error": first_error}
    return {**out, "ok": False, "error": first_error}


def default_picks(req: dict) -> list[dict]:
    """aiconfigurator's own ``cli_default`` aggregated picks for the same inputs (best first)."""
    from aiconfigurator.cli.api import cli_default

    r = cli_default(req["model_dir"], int(req["total_gpus"]), req["system"], backend=req["backend"],
                    isl=int(req["isl"]), osl=int(req["osl"]), ttft=float(req["ttft_ms"]),
                    tpot=float(req["tpot_ms"]), top_n=int(req.get("top_n", 5)))
    df = r.best_configs.get("agg")
    rows = []
    if df is not None:
        for _, row in df.iterrows():
            rows.append({"tp_size": int(row["tp"]), "pp_size": int(row["pp"]), "batch_size": int(row["bs"]),
                         "ctx_tokens": int(row["ctx_tokens"]), "gemm": str(row["gemm"]),
                         "kvcache": str(row["kvcache"]), "ttft_ms": float(row["ttft"]),
                         "tpot_ms": float(row["tpot"]), "tokens_per_s_per_gpu": float(row["tokens/s/gpu"]),
                         "num_gpus": int(row["num_total_gpus"]), "backend_version": str(row["version"])})
    return rows


def info() -> dict:
    from importlib.metadata import version

    from aiconfigurator.sdk.common import ARCHITECTURE_TO_MODEL_FAMILY, GEMMQuantMode, MoEQuantMode
    from aiconfigurator.sdk.perf_database import get_latest_database_version

    systems = {}
    for system in ("h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm", "l40s", "l4"):
        systems[system] = {b: get_latest_database_version(system=system, backend=b)
                           for b in ("trtllm", "vllm", "sglang")}
    return {"aiconfigurator": version("aiconfigurator"), "aiconfigurator_core": version("aiconfigurator-core"),
            "architectures": dict(ARCHITECTURE_TO_MODEL_FAMILY), "systems": systems,
            "gemm_quant_modes": [m.name for m in GEMMQuantMode], "moe_quant_modes": [m.name for m in MoEQuantMode]}


def main() -> int:
    req = json.loads(sys.stdin.read())
    out = sys.stdout
    sys.stdout = sys.stderr  # the library prints; only our JSON lines go to the real stdout
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    logging.disable(logging.WARNING)
    _fast_yaml()

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    op = req.get("op")
    if op == "info":
        emit(info())
    elif op == "estimate":
        versions = _Versions()
        for point in req["points"]:
            emit(estimate(point, versions))
    elif op == "default":
        emit({"picks": default_picks(req)})
    else:
        emit({"error": f"unknown op {op!r}"})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
