"""What a rule's fix may suggest for a build on a target, each choice checked against the rules that judge it.

A fix that says "use quant_algo X", "use runtime Y" or "raise Z" names X, Y or Z only when it passes the same
rules on the same target: the runtimes the target profile runs (``configs/targets/*.yaml`` ``runtimes``), the SM
gates (plugins.resolve.sm_refusals: judged on the engine runtimes only, as builders.preflight judges them; the
portable runtime dequantizes), the family support rule (plugins.architectures.support) and the field's bounds in
the build schema (builders.spec). builders.preflight and builders.plan_warnings word their fixes from these.
"""

from __future__ import annotations

from typing import Callable, Optional

from pydantic import BaseModel

from builders.spec import ResolvedBuild
from plugins.architectures import Architecture, support
from plugins.recipes import QUANT_RECIPES
from plugins.resolve import SM_FP8_MIN, sm_refusals
from plugins.runtimes import RUNTIMES, Runtime
from plugins.targets import TargetProfile


def runtime_passes(build: ResolvedBuild, target: TargetProfile, name: str,
                   arch: Optional[Architecture] = None) -> bool:
    """Whether runtime ``name`` with the build's quantization passes the target's rules: the target runs it, the
    SM gates (an engine runtime's quantization and FP8 KV cache), the serving features the spec asks for
    (:func:`feature_refusals`) and, with ``arch``, the family support rule."""
    rt, recipe = RUNTIMES[name], build.recipe
    if name not in target.runtimes:
        return False
    if rt.sharded and target.kind == "gpu":
        if sm_refusals(recipe, target.sm, trtllm_build=rt.builds_trt_engine):
            return False
        if build.settings.quantization.kv_cache_quant_algo == "fp8" and (target.sm or 0) < SM_FP8_MIN:
            return False
    return not feature_refusals(build, rt) and (arch is None or support(arch, rt, recipe).ok)


def feature_refusals(build: ResolvedBuild, rt: Runtime) -> list[str]:
    """The spec's serving features runtime ``rt`` lacks (the codes of builders.preflight's runtime-feature rules):
    ``guided_backend_runtime`` (its guided_decoding_backend), ``llmapi_feature`` (speculative decoding: the LLM
    API only), ``kv_host_cache_runtime`` (a host KV tier), ``context_logits_runtime`` (gather_context_logits:
    trtllm-build only), ``pytorch_needs_decoupled`` (a decoupled-only runtime with the decoupled policy off)."""
    sv, lim = build.settings.serving, build.settings.limits
    out = []
    if sv.guided_decoding_backend and sv.guided_decoding_backend not in rt.guided_backends:
        out.append("guided_backend_runtime")
    if sv.speculative_decoding is not None and not rt.llm_api:
        out.append("llmapi_feature")
    if sv.kv_cache_host_memory_bytes and not rt.host_kv_tier:
        out.append("kv_host_cache_runtime")
    if lim.gather_context_logits and not rt.builds_trt_engine:
        out.append("context_logits_runtime")
    if rt.decoupled_only and not build.decoupled:
        out.append("pytorch_needs_decoupled")
    return out


def runtimes(build: ResolvedBuild, target: TargetProfile, trait: Callable[[Runtime], bool] = lambda rt: True,
             arch: Optional[Architecture] = None) -> list[str]:
    """Runtimes other than the build's, with ``trait``, that pass :func:`runtime_passes` (registry order)."""
    return [n for n, rt in RUNTIMES.items()
            if n != build.settings.runtime and trait(rt) and runtime_passes(build, target, n, arch)]


def quants(build: ResolvedBuild, target: TargetProfile, arch: Optional[Architecture] = None, *,
           lighter: bool = False) -> list[str]:
    """``quantization.quant_algo`` values other than the build's that its runtime runs on ``target``: the SM
    gates where the runtime is an engine runtime on a GPU, and, with ``arch``, the family support rule.
    ``lighter``: only recipes with fewer bits per weight than the build's (what shrinks the weights)."""
    rt, current = build.runtime, build.recipe
    sm = target.sm if rt.sharded and target.kind == "gpu" else None
    return [n for n, r in QUANT_RECIPES.items()
            if n != current.name and not (lighter and r.weight_bits >= current.weight_bits)
            and not sm_refusals(r, sm, trtllm_build=rt.builds_trt_engine)
            and (arch is None or support(arch, rt, r).ok)]


def fp8_kv_possible(build: ResolvedBuild, target: TargetProfile) -> bool:
    """An FP8 KV cache would shrink this build's KV pool: an engine runtime (the portable runtime keeps the cache in
    its compute dtype), a target of SM >= 89 (the ``fp8_kv_sm`` rule), and not FP8 already."""
    return (build.runtime.sharded and target.kind == "gpu" and (target.sm or 0) >= SM_FP8_MIN
            and build.settings.quantization.kv_cache_quant_algo != "fp8")


def upper_bound(section: type[BaseModel], name: str) -> Optional[float]:
    """The most the build schema lets ``section.name`` be (its ``le``/``lt`` bound), None when unbounded."""
    for meta in section.model_fields[name].metadata:
        for attr in ("le", "lt"):
            if getattr(meta, attr, None) is not None:
                return getattr(meta, attr)
    return None


def can_raise(section: type[BaseModel], name: str, value: float) -> bool:
    """Whether ``value`` of ``section.name`` is below the schema's bound (a fix may say "raise it")."""
    bound = upper_bound(section, name)
    return bound is None or value < bound
