"""Run NVIDIA aiconfigurator's performance model for a batch of points: the process side of builders/perf_model.py.

aiconfigurator 0.12 needs numpy >= 2.1 and the pipeline's environment pins numpy < 2 (the Triton Python
backend), so this file runs in aiconfigurator's own interpreter (``.aiconfigurator/bin/python``, made by
``make setup``) and imports nothing from the project: only the standard library and aiconfigurator.

Protocol: one JSON object on stdin, JSON lines on stdout (one per point, in order, so the caller can show
progress); everything aiconfigurator prints goes to stderr.

- ``{"op": "info"}`` -> ``{"aiconfigurator": version, "architectures": {...}, "systems": {system: {backend:
  version}}, "gemm_quant_modes": [...], "moe_quant_modes": [...]}``: the library's version, the HF architectures it
  models, each system's default database version and its quantization mode names.
- ``{"op": "estimate", "points": [point, ...], "via": "sdk"}`` -> one line per point. A point holds ``id``,
  ``model_dir`` (a folder with config.json), ``system``, ``backend`` and the keyword arguments of
  ``aiconfigurator.cli.api.cli_estimate`` (mode agg): isl, osl, batch_size, ctx_tokens, tp_size, pp_size,
  attention_dp_size (batch_size is then per attention-DP rank), moe_tp_size, moe_ep_size, gemm_quant_mode,
  kvcache_quant_mode, moe_quant_mode, free_gpu_memory_fraction, max_seq_len. The answer is ``{"id", "ok": true,
  "ttft_ms", "tpot_ms", ...}`` or ``{"id", "ok": false, "error"}``.
  ``via`` (optional) picks the route: ``"sdk"`` (the default, :func:`agg_via_sdk`) or ``"cli_api"`` (``cli_estimate``
  itself, the reference the SDK route is tested against: tests/builders/test_aiconfigurator_worker.py).
- ``{"op": "default", "model_dir", "system", "backend", "total_gpus", "isl", "osl", "ttft_ms", "tpot_ms"}`` ->
  the aggregated configurations aiconfigurator's own ``cli_default`` picks, best first.

Database modes (aiconfigurator ``PerfDatabase``): SILICON answers from measured kernel tables only and raises
where a table lacks the shape; the point is then retried in HYBRID (measured where present, empirical /
speed-of-light formulas elsewhere) and says so.

Why the SDK route: ``aiconfigurator.cli.api`` imports pandas, matplotlib.pyplot and the CLI's report writers before
it estimates anything (~1.2 s of a cold plan's ~2.7 s in this process on an idle core), and ``cli_estimate`` loads
the context-attention table into Python (~1 s) to check an FP8-FMHA fallback that cannot apply to our points (see
:func:`_fmha_check_can_change`). The SDK route makes the same calls as ``cli_estimate``'s aggregated path
(``aiconfigurator/cli/api.py`` 0.12.0: ``cli_estimate`` -> ``_run_agg_estimate``) on the objects below it
(``build_model_config``, ``get_model``, ``get_database_view``, ``get_backend``, ``InferenceSession.run_agg``)
and skips only that check where it is provably a no-op.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Callable, NamedTuple

_RESULT_KEYS = {  # our name: aiconfigurator's result-dict key (InferenceSummary.get_result_dict)
    "ttft_ms": "ttft", "tpot_ms": "tpot", "request_latency_ms": "request_latency", "tokens_per_s": "tokens/s",
    "tokens_per_s_per_gpu": "tokens/s/gpu", "tokens_per_s_per_user": "tokens/s/user", "seq_per_s": "seq/s",
    "concurrency": "concurrency", "memory_gib": "memory", "num_gpus": "num_total_gpus",
}
_ESTIMATE_ARGS = ("isl", "osl", "batch_size", "ctx_tokens", "tp_size", "pp_size", "attention_dp_size",
                  "moe_tp_size", "moe_ep_size", "gemm_quant_mode", "kvcache_quant_mode", "moe_quant_mode",
                  "free_gpu_memory_fraction", "max_seq_len")


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


def latest_version(system: str, backend: str) -> str | None:
    """``get_latest_database_version(system, backend)``'s answer, read from the version slots where they decide it.

    aiconfigurator_core/sdk/perf_database.py 0.12.0: with slots for (system, backend) and at least one declared
    version folder of the backend in the system's data folder, "latest" is ``slots["current"]``; the library gets
    there by scanning every system's YAML and database folders (``get_supported_databases``, ~0.2 s of CPU, a
    seventh of a cold plan's prediction). Anything else (no slots, no declared folder, a helper missing, an
    unreadable system YAML) asks the library itself. tests/builders/test_aiconfigurator_worker.py holds the two
    equal for every system and framework.
    """
    from aiconfigurator.sdk.perf_database import get_latest_database_version, get_systems_paths, get_version_slots

    try:
        import os

        import yaml
        from aiconfigurator.sdk.perf_database import _declared_versions

        slots = get_version_slots(system, backend)
        declared = False
        for root in get_systems_paths():
            spec_path = os.path.join(root, f"{system}.yaml")
            if not os.path.isfile(spec_path):
                continue
            with open(spec_path) as f:
                spec = yaml.safe_load(f)
            data_dir = os.path.join(root, spec.get("data_dir", ""))
            declared = declared or (os.path.isdir(data_dir) and bool(_declared_versions(data_dir, backend)))
        if slots is not None and declared:
            return slots["current"]
    except Exception:  # a helper renamed, a YAML the library would skip: its own answer
        pass
    return get_latest_database_version(system=system, backend=backend)


class _Versions:
    def __init__(self):
        self._cache: dict[tuple[str, str], str | None] = {}

    def get(self, system: str, backend: str) -> str | None:
        key = (system, backend)
        if key not in self._cache:
            self._cache[key] = latest_version(system, backend)
        return self._cache[key]


class _Answer(NamedTuple):
    """What :func:`estimate` reads of one aggregated estimate, from either route."""

    raw: dict
    """``InferenceSummary.get_result_dict()``: ttft and tpot in ms, tokens/s, memory in GiB ..."""
    per_ops_data: dict | None
    """Latency of each operation of each step (ms)."""
    per_ops_source: dict | None
    """Where each operation's latency came from (:data:`MEASURED_TAGS` and the formula tags)."""
    kv_cache_warning: str | None
    """Set when batch_size exceeds the KV cache's capacity."""


_CLI_DEFAULTS = {"isl": 1024, "osl": 1024, "batch_size": 128, "tp_size": 1, "pp_size": 1}
"""``cli_estimate``'s defaults for the arguments a point may leave out (aiconfigurator/cli/api.py 0.12.0)."""


def agg_via_cli_api(point: dict, version: str, mode: str, kwargs: dict) -> _Answer:
    """One aggregated estimate through ``aiconfigurator.cli.api.cli_estimate`` (the library's public API).

    Raises what the library raises: ValueError (bad inputs, no database), RuntimeError (OOM, no result).
    """
    from aiconfigurator.cli.api import cli_estimate

    r = cli_estimate(point["model_dir"], point["system"], mode="agg", backend_name=point["backend"],
                     backend_version=version, database_mode=mode, **kwargs)
    return _Answer(r.raw, r.per_ops_data, r.per_ops_source, r.kv_cache_warning)


def _fmha_check_can_change(model_dir: str, model_config) -> bool:
    """Whether ``resolve_context_fmha_by_data`` could change or refuse ``model_config``.

    It only acts when the FMHA mode is set explicitly (it raises for fp8 without data) or when the checkpoint's own
    quantization would infer fp8 FMHA (it falls back to bf16); otherwise it returns after loading the
    context-attention table, which costs ~1 s cold (aiconfigurator_core/sdk/models/helpers.py 0.12.0,
    ``resolve_context_fmha_by_data`` and ``_infer_quant_modes_from_raw_config``). Our points never set the FMHA mode
    and our model folders carry no quantization entries, so this is False for them; where the helpers it reads are
    missing it says True, and the check runs.
    """
    if model_config.fmha_quant_mode is not None:
        return True
    try:
        from aiconfigurator.sdk.common import FMHAQuantMode
        from aiconfigurator.sdk.models.helpers import _get_model_info, _infer_quant_modes_from_raw_config
    except ImportError:
        return True
    info = _get_model_info(model_dir)
    inferred = _infer_quant_modes_from_raw_config(info.get("raw_config", {}), info.get("architecture"))
    return inferred.get("fmha_quant_mode") == FMHAQuantMode.fp8


def agg_via_sdk(point: dict, version: str, mode: str, kwargs: dict) -> _Answer:
    """One aggregated estimate through aiconfigurator's SDK: ``cli_estimate(mode="agg")``'s own calls, in its order
    (aiconfigurator/cli/api.py 0.12.0, ``cli_estimate`` and ``_run_agg_estimate``), without importing ``cli.api``.

    What differs: no nextn / speculative decoding, images or prefix (our points set none, and these are the
    library's defaults), no power figure (we read none), and the FMHA check runs only where it can act
    (:func:`_fmha_check_can_change`). Raises what ``cli_estimate`` raises, with the same messages.
    """
    from aiconfigurator.sdk.backends.factory import get_backend
    from aiconfigurator.sdk.config import ModelConfig, RuntimeConfig
    from aiconfigurator.sdk.config_builders import apply_nextn, build_model_config
    from aiconfigurator.sdk.inference_session import InferenceSession
    from aiconfigurator.sdk.models import (check_is_moe, get_model, resolve_context_fmha_by_data,
                                           resolve_dsv4_moe_arch, resolve_nvfp4_for_system)
    from aiconfigurator.sdk.perf_database import get_database_view
    from aiconfigurator.sdk.speculative import SpeculativeDecodingProfile

    a = {**_CLI_DEFAULTS, **kwargs}
    model_path, system, backend_name = point["model_dir"], point["system"], point["backend"]
    tp, pp, dp = a["tp_size"], a["pp_size"], a.get("attention_dp_size", 1)
    moe_tp, moe_ep = a.get("moe_tp_size"), a.get("moe_ep_size")
    if check_is_moe(model_path):  # _resolve_moe_parallelism
        moe_tp, moe_ep = ModelConfig(tp_size=tp, attention_dp_size=dp, moe_tp_size=moe_tp,
                                     moe_ep_size=moe_ep).resolve_moe_parallelism()
    model_config = build_model_config(tp, pp, dp, moe_tp, moe_ep, a.get("gemm_quant_mode"),
                                      a.get("kvcache_quant_mode"), None, a.get("moe_quant_mode"), None,
                                      forward_model=None, enable_encoder_dp=True, attention_backend=None)
    apply_nextn(model_config, 0)
    database = get_database_view(system, backend_name, version, allow_missing_data=mode != "SILICON",
                                 database_mode=mode, transfer_policy=None)
    if database is None:
        raise ValueError(f"Failed to load perf database for system={system}, backend={backend_name}, "
                         f"version={version}.")
    if _fmha_check_can_change(model_path, model_config):
        resolve_context_fmha_by_data(model_config, model_path, database, backend_name, is_context_role=True)
    resolve_dsv4_moe_arch(model_config, model_path, system_name=system, backend_name=backend_name)
    resolve_nvfp4_for_system(model_config, system, model_path, backend_name=backend_name)
    runtime_config = RuntimeConfig(isl=a["isl"], osl=a["osl"], batch_size=a["batch_size"], image_height=0,
                                   image_width=0, num_images_per_request=1, prefix=0, engine_step_backend=None)
    model = get_model(model_path, model_config, backend_name)
    session = InferenceSession(model, database, get_backend(backend_name))
    speculative = SpeculativeDecodingProfile.from_inputs(0, None)
    ctx_tokens = a["ctx_tokens"] if a.get("ctx_tokens") is not None else a["isl"]
    summary = session.run_agg(runtime_config, ctx_tokens=ctx_tokens,
                              max_seq_len=a.get("max_seq_len"),
                              free_gpu_memory_fraction=a.get("free_gpu_memory_fraction"),
                              decode_tokens_per_iteration=speculative.tokens_per_iteration)
    summary = speculative.project_summary(summary, role="agg")
    if summary.check_oom():
        raise RuntimeError(
            f"OOM: the model '{model_path}' does not fit in GPU memory on system '{system}' "
            f"with the given parallelism (tp={tp}, pp={pp}, dp={dp}). "
            "Try increasing tp_size/pp_size, using a quantized model, or "
            "using a system with more VRAM per GPU.")
    raw = summary.get_result_dict()
    if raw is None:
        raise RuntimeError("Estimation produced no results. The configuration may be invalid.")
    kv_warning = None
    if summary.check_kv_cache_oom():
        frac = a.get("free_gpu_memory_fraction")
        frac_str = str(frac) if frac is not None else "backend default"
        kv_warning = (f"Requested batch_size ({a['batch_size']}) exceeds estimated KV cache capacity "
                      f"(free_gpu_memory_fraction={frac_str}). "
                      "The serving runtime will queue excess requests, causing significantly higher TTFT and "
                      "inaccurate TPOT.")
    return _Answer(raw, summary.get_per_ops_data(), summary.get_per_ops_source(), kv_warning)


ROUTES: dict[str, Callable[[dict, str, str, dict], _Answer]] = {"sdk": agg_via_sdk, "cli_api": agg_via_cli_api}
"""The request's ``via``: how one aggregated estimate is made (the same numbers either way)."""


def estimate(point: dict, versions: _Versions, via: str = "sdk") -> dict:
    """One point through ``ROUTES[via]`` (SILICON, then HYBRID where a measured table is missing)."""
    route = ROUTES[via]
    out = {"id": point.get("id")}
    version = point.get("backend_version") or versions.get(point["system"], point["backend"])
    if version is None:
        return {**out, "ok": False, "error": f"aiconfigurator has no {point['backend']} database for system "
                                             f"{point['system']}"}
    kwargs = {k: point[k] for k in _ESTIMATE_ARGS if point.get(k) is not None}
    first_error = None
    for mode in ("SILICON", "HYBRID"):
        try:
            r = route(point, version, mode, kwargs)
        except Exception as e:  # the library raises ValueError, RuntimeError (OOM) and its own errors
            quoted = f"'{point['model_dir']}'"  # our cache folder means nothing to the reader
            msg = _short(e).replace(f"the model {quoted}", "the model").replace(quoted, "the model")
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
        via = req.get("via", "sdk")
        if via not in ROUTES:
            emit({"error": f"unknown via {via!r}: one of {sorted(ROUTES)}"})
            return 2
        versions = _Versions()
        for point in req["points"]:
            emit(estimate(point, versions, via))
    elif op == "default":
        emit({"picks": default_picks(req)})
    else:
        emit({"error": f"unknown op {op!r}"})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
