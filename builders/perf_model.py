"""Predicted speed of a build: NVIDIA aiconfigurator's performance model behind one small adapter.

aiconfigurator 0.12.0 (with aiconfigurator-core 0.12.0; its successor ``aisimulate`` has development builds
only) carries per-GPU databases of measured kernel timings for TensorRT-LLM, vLLM and SGLang and composes them
into TTFT, TPOT and throughput of an aggregated in-flight-batching worker. It needs numpy >= 2.1, the
pipeline pins numpy < 2 (Triton's Python backend), so it lives in its own environment (``.aiconfigurator/``,
made by ``make setup``; ``$TRTPIPE_AICONFIGURATOR_PYTHON`` points elsewhere) and runs through
``builders/aiconfigurator_worker.py``, which makes ``aiconfigurator.cli.api.cli_estimate``'s calls on the SDK below it
(the same numbers without importing the CLI's pandas / matplotlib stack; the worker's docstring says why).
Without it the plan has no predictions and says why. On a target it has no database for (:func:`no_database`: no
system, or an estimate-only one) the plan carries the first-principles estimate of builders/roofline.py instead,
labelled as such.

The spec maps to its inputs through the registries: the target's ``aiconfigurator_system``, the recipe's
``aiconfigurator_gemm`` / ``aiconfigurator_moe``, the family's ``aiconfigurator`` flag, the KV-cache dtype, tp / pp
/ moe_tp / moe_ep, ``limits.max_num_tokens`` bounding the per-step context-token budget (``ctx_tokens``, see
:func:`at_concurrency`),
``serving.kv_cache_free_gpu_mem_fraction`` (its KV check then counts ISL+OSL per sequence, as the plan's workload
concurrency does: paged KV allocates blocks as sequences grow). Predictions are cached by their inputs
under ``<cache>/predictions/`` (they depend on nothing else).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional

from builders import perf_calibration, roofline
from builders.plan import BackendPrediction, PerformancePrediction, Plan, PredictedPoint
from builders.spec import ResolvedBuild
from plugins.architectures import architecture
from plugins.fsutil import cache_root, project_root, write_json
from plugins.targets import TargetProfile

AICONFIGURATOR_VERSION = "0.12.0"
"""The pinned release (scripts/setup.sh installs it with aiconfigurator-core of the same version)."""
BACKENDS = ("trtllm", "vllm", "sglang")
"""The frameworks aiconfigurator models; trtllm is the build's own, the others are side by side."""
WORKER = Path(__file__).with_name("aiconfigurator_worker.py")
SPLIT_AT = 200
"""Points of one framework above which they are spread over one process per core (each process imports the library
and loads the database, ~1.5 s of CPU, then answers a point in a few ms, so short lists stay in one)."""
ESTIMATE_ONLY = frozenset({"l4"})
"""aiconfigurator 0.12.0's systems without a database of any framework: ``systems/l4.yaml`` is "estimate-only ... No
built-in silicon performance database is provided for this PCIe SKU"; its SILICON and HYBRID modes refuse it
(tests/facts/aiconfigurator_0_12_0/info.json: no database version for any backend)."""
SOURCE = (f"aiconfigurator {AICONFIGURATOR_VERSION} (NVIDIA's measured-kernel performance model): predictions, "
          "not measurements of this build")


class PerfModelUnavailable(RuntimeError):
    """aiconfigurator cannot answer: not installed, or its process failed (the message says which and the fix)."""


def interpreter() -> Path:
    """The Python of aiconfigurator's environment.

    ``$TRTPIPE_AICONFIGURATOR_PYTHON``, else ``.aiconfigurator/bin/python`` under the project root, else under
    this checkout. Raises PerfModelUnavailable naming ``make setup`` when none exists.
    """
    env = os.environ.get("TRTPIPE_AICONFIGURATOR_PYTHON")
    if env:
        if not Path(env).is_file():
            raise PerfModelUnavailable(f"TRTPIPE_AICONFIGURATOR_PYTHON={env} is not a file")
        return Path(env)
    for root in (project_root(), Path(__file__).resolve().parents[1]):
        py = root / ".aiconfigurator" / "bin" / "python"
        if py.is_file():
            return py
    raise PerfModelUnavailable(f"aiconfigurator {AICONFIGURATOR_VERSION} is not installed (run make setup, which "
                               "puts it in .aiconfigurator/, or set TRTPIPE_AICONFIGURATOR_PYTHON)")


def run_worker(request: dict, *, on_line: Optional[Callable[[dict], None]] = None,
               timeout_s: float = 1800) -> list[dict]:
    """Send ``request`` to builders/aiconfigurator_worker.py and return its JSON lines (protocol there).

    Raises:
        PerfModelUnavailable: no interpreter, or the process exited non-zero (its last stderr lines quoted).
    """
    py = interpreter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(py), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        out: list[dict] = []
        deadline = time.monotonic() + timeout_s
        try:
            try:
                proc.stdin.write(json.dumps(request))
                proc.stdin.close()
            except BrokenPipeError:  # it exited before reading the request: its exit status and stderr say why
                pass
            for line in proc.stdout:
                obj = json.loads(line)
                out.append(obj)
                if on_line is not None:
                    on_line(obj)
                if time.monotonic() > deadline:
                    raise PerfModelUnavailable(f"aiconfigurator took more than {timeout_s:.0f} s")
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc != 0:
            err.seek(0)
            tail = " | ".join(err.read().strip().splitlines()[-3:])
            raise PerfModelUnavailable(f"aiconfigurator ({py}) exited {rc}: {tail}")
    return out


def info() -> dict:
    """The library's version, the HF architectures it models and each system's default database versions."""
    return run_worker({"op": "info"})[0]


def model_dir(hf_config: dict) -> Path:
    """A folder holding ``hf_config`` as config.json (what aiconfigurator reads), named by its content.

    The checkpoint's own quantization entries are dropped: the quant modes are passed explicitly.
    """
    cfg = {k: v for k, v in hf_config.items()
           if k not in ("_name_or_path", "quantization_config", "hf_quant_config")}
    blob = json.dumps(cfg, sort_keys=True).encode()
    folder = cache_root() / "predictions" / "models" / hashlib.sha256(blob).hexdigest()[:16]
    if not (folder / "config.json").is_file():
        write_json(folder / "config.json", cfg)
    return folder


def no_database(target: TargetProfile) -> str:
    """Why aiconfigurator has no measured kernels for ``target`` ("" when it has). One clause."""
    if target.kind != "gpu" or not target.aiconfigurator_system:
        return f"aiconfigurator {AICONFIGURATOR_VERSION} has no system for target {target.name}"
    if target.aiconfigurator_system in ESTIMATE_ONLY:
        return (f"aiconfigurator {AICONFIGURATOR_VERSION} has no database for target {target.name} (its "
                f"{target.aiconfigurator_system} system is estimate-only)")
    return ""


def refusal(build: ResolvedBuild, target: TargetProfile, hf_config: dict) -> str:
    """Why aiconfigurator cannot model this build on this target ("" when it can). One clause."""
    if not build.runtime.predicted:
        return (f"runtime {build.runtime.name} is not TensorRT-LLM: aiconfigurator predicts the trtllm and "
                "trtllm-llmapi runtimes")
    if no_database(target):
        return no_database(target)
    arch = architecture((hf_config.get("architectures") or [None])[0])
    if arch is None or not arch.aiconfigurator:
        name = arch.name if arch else (hf_config.get("architectures") or ["?"])[0]
        return f"aiconfigurator {AICONFIGURATOR_VERSION} does not model {name}"
    rec = build.recipe
    if rec.aiconfigurator_gemm is None:
        return f"aiconfigurator {AICONFIGURATOR_VERSION} has no GEMM mode for quant_algo {rec.name}"
    if arch.moe is not None and rec.aiconfigurator_moe is None:
        return f"aiconfigurator {AICONFIGURATOR_VERSION} has no MoE GEMM mode for quant_algo {rec.name}"
    return ""


def base_point(build: ResolvedBuild, target: TargetProfile, plan: Plan, hf_config: dict) -> dict:
    """aiconfigurator's inputs for this build (every point of the plan shares them; batch_size varies)."""
    s = build.settings
    moe = plan.model.is_moe
    return {"model_dir": str(model_dir(hf_config)), "system": target.aiconfigurator_system,
            "isl": plan.memory.kv.workload_isl, "osl": plan.memory.kv.workload_osl,
            "ctx_tokens": s.limits.max_num_tokens, "tp_size": plan.serving_tp, "pp_size": plan.serving_pp,
            "moe_tp_size": plan.moe_tp_size if moe else None, "moe_ep_size": plan.moe_ep_size if moe else None,
            "gemm_quant_mode": build.recipe.aiconfigurator_gemm,
            "moe_quant_mode": build.recipe.aiconfigurator_moe if moe else None,
            "kvcache_quant_mode": "fp8" if s.quantization.kv_cache_quant_algo == "fp8" else "bfloat16",
            "free_gpu_memory_fraction": s.serving.kv_cache_free_gpu_mem_fraction,
            **({"attention_dp_size": plan.attention_dp_size} if plan.attention_dp_size > 1 else {})}


def at_concurrency(base: dict, backend: str, concurrency: int) -> dict:
    """One point: ``base`` at ``concurrency`` requests in flight, for ``backend``.

    ``ctx_tokens`` (aiconfigurator's per-step context-token budget, which its aggregated model fills every context
    step) is ``min(max_num_tokens, concurrency x ISL)``: a step holds at most the prompts of the requests in flight
    (at concurrency 1 and max_num_tokens 8192 a full budget would price a 128-token prompt as an 8192-token step).
    With attention DP both are per rank: aiconfigurator's batch_size is one attention-DP rank's (its
    ``global_bs = batch_size x attention_dp_size``, aiconfigurator_core/sdk/backends/base_backend.py 0.12.0), so
    ``concurrency`` is split evenly over the ranks (rounded up).
    """
    per_rank = -(-concurrency // (base.get("attention_dp_size") or 1))
    return {**base, "backend": backend, "batch_size": per_rank,
            "ctx_tokens": max(1, min(base["ctx_tokens"], per_rank * base["isl"]))}


def concurrencies(most: int, step: int = 1) -> list[int]:
    """step x (1, 4, 16, 64, 256 ...) below ``most``, and ``most`` itself (the plan's in-flight sequences);
    ``step``: the attention-DP ranks, so every rank holds as many."""
    out, c = [], step
    while c < most:
        out.append(c)
        c *= 4
    return out + [most] if most >= 1 else []


def _key(point: dict) -> str:
    body = {k: v for k, v in point.items() if k != "id"}
    blob = json.dumps({"point": body, "aiconfigurator": AICONFIGURATOR_VERSION,
                       "worker": hashlib.sha256(WORKER.read_bytes()).hexdigest()}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def estimate(points: list[dict], *, progress: Optional[Callable[[int, int], None]] = None,
             use_cache: bool = True) -> tuple[list[dict], int]:
    """aiconfigurator's answer for each point (worker protocol), and how many came from the cache.

    Raises:
        PerfModelUnavailable: see :func:`run_worker`.
    """
    folder = cache_root() / "predictions" / "points"
    keys = [_key(p) for p in points]
    results: list[Optional[dict]] = [None] * len(points)
    if use_cache:
        for i, k in enumerate(keys):
            f = folder / f"{k}.json"
            if f.is_file():
                results[i] = json.loads(f.read_text())
    todo = [i for i, r in enumerate(results) if r is None]
    cached = len(points) - len(todo)
    if todo:
        done = [cached]

        def step(_obj):
            done[0] += 1
            if progress is not None:
                progress(done[0], len(points))

        by_backend: dict[str, list[int]] = {}
        for i in todo:  # one process per framework: each loads its own database (seconds), so they overlap
            by_backend.setdefault(points[i].get("backend", ""), []).append(i)
        cpus = os.cpu_count() or 1
        groups: dict[str, list[int]] = {}
        for b, idx in by_backend.items():  # a long list (trtpipe tune) also splits over the cores
            n = cpus if len(idx) >= SPLIT_AT and len(by_backend) < cpus else 1
            for j in range(n):
                groups[f"{b}/{j}"] = idx[j::n]
        lock = threading.Lock()

        def locked_step(obj):
            with lock:
                step(obj)

        def one(idx: list[int]) -> list[dict]:
            return run_worker({"op": "estimate", "points": [{**points[i], "id": i} for i in idx]},
                              on_line=locked_step)

        with ThreadPoolExecutor(max_workers=max(1, min(len(groups), os.cpu_count() or 1))) as pool:
            answers = [a for part in pool.map(one, groups.values()) for a in part]
        by_id = {a["id"]: a for a in answers}
        for i in todo:
            a = by_id.get(i) or {"ok": False, "error": "no answer from aiconfigurator"}
            results[i] = a
            if "id" in a:  # the library's answer, error or not, depends only on the point
                write_json(folder / f"{keys[i]}.json", a)
    return [r for r in results], cached


def _point(c: int, r: dict) -> PredictedPoint:
    return PredictedPoint(concurrency=c, ttft_ms=r["ttft_ms"], tpot_ms=r["tpot_ms"],
                          request_latency_ms=r["request_latency_ms"], output_tokens_per_s=r["tokens_per_s"],
                          output_tokens_per_s_per_gpu=r["tokens_per_s_per_gpu"],
                          output_tokens_per_s_per_user=r["tokens_per_s_per_user"],
                          kv_cache_warning=r.get("kv_cache_warning"))


def predict_plan(build: ResolvedBuild, target: TargetProfile, plan: Plan, hf_config: dict, *,
                 backends: Iterable[str] = BACKENDS,
                 progress: Optional[Callable[[int, int], None]] = None) -> PerformancePrediction:
    """The plan's predictions: each backend at :func:`concurrencies` of the plan's in-flight sequences
    (``memory.kv.workload_concurrency``: max_batch_size, or fewer where the KV pool holds fewer of the plan's
    ISL+OSL). Never raises: what cannot be predicted is ``available: false`` with the reason. Where aiconfigurator
    has no database for the target (:func:`no_database`), or is not installed or fails, builders/roofline.py
    estimates instead, for TensorRT-LLM alone, with aiconfigurator's reason."""
    t0 = time.monotonic()
    why = refusal(build, target, hf_config)
    concs = concurrencies(plan.memory.kv.workload_concurrency, plan.attention_dp_size)
    if why and why == no_database(target):
        return roofline.predict_plan(plan, target, concs, why)
    if why:
        return PerformancePrediction(available=False, reason=why)
    if not concs:
        return PerformancePrediction(available=False, reason="the KV pool holds no sequence of the plan's ISL+OSL")
    base = base_point(build, target, plan, hf_config)
    backends = list(backends)
    points = [at_concurrency(base, b, c) for b in backends for c in concs]
    try:
        answers, cached = estimate(points, progress=progress)
    except PerfModelUnavailable as e:  # not installed, or its process failed: the labelled estimate instead
        return roofline.predict_plan(plan, target, concs, str(e))
    out = []
    for b in backends:
        rows = [(c, a) for (p, a), c in zip(zip(points, answers), concs * len(backends)) if p["backend"] == b]
        good = [(c, a) for c, a in rows if a.get("ok")]
        errors = sorted({a.get("error") or "" for _, a in rows if not a.get("ok")})
        if not good:
            out.append(BackendPrediction(backend=b, version=next((a.get("backend_version") for _, a in rows), None),
                                         error=errors[0] if errors else "no prediction"))
            continue
        modes = {a["database_mode"] for _, a in good}
        shares = [a["silicon_share"] for _, a in good if a.get("silicon_share") is not None]
        out.append(BackendPrediction(
            backend=b, version=good[0][1].get("backend_version"),
            database_mode="HYBRID" if "HYBRID" in modes else "SILICON",
            measured_share=round(min(shares), 3) if shares else None,
            points=[_point(c, a) for c, a in good],
            error=(f"no prediction at some concurrencies: {errors[0]}" if errors else None)))
    inputs = {k: v for k, v in base.items() if k not in ("model_dir", "system", "isl", "osl")}
    pred = PerformancePrediction(available=True, source=SOURCE, system=base["system"], isl=base["isl"],
                                 osl=base["osl"], inputs=inputs, backends=out,
                                 elapsed_s=round(time.monotonic() - t0, 2), cached=cached == len(points))
    return perf_calibration.apply(pred, plan.serving_pp, plan.model.is_moe,  # the uncorrected numbers stay
                                  attention_dp=plan.attention_dp_size > 1)
