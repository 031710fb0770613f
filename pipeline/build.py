"""The build: spec -> plan -> quantized checkpoint -> verify -> engine -> Triton repository -> deploy files.

:func:`run_build` is the ordered stage list and nothing else. The plan is computed once (the rules of
builders.preflight, the memory plan, the plugin decisions) and handed, with the resolved build, to
every stage in a :class:`BuildContext`. Each stage's cache key is the spec fields that decide it
(declared beside them with ``builders.spec.decides``) plus the inputs that are not spec fields (the
source digest, library versions, the upstream stage's key); pipeline.cache reuses a folder whose key
matches and writes a new one atomically, so a changed field reruns only the stages after it.

Outputs: ``build/<name>/<target>/{checkpoint,verify,engine,model_repo,deploy}/`` (``bundle/`` instead of
``engine``/``model_repo`` for the trtllm runtime where TensorRT-LLM is not installed), ``plan.json`` and
``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from builders import model_fetch, preflight, prequant
from builders.digest import source_digest
from builders.engine_trtllm import TRTLLM_VERSION, Toolchain
from builders.layout import build_dir
from builders.model_fetch import TOKENIZER_COMPAT
from builders.plan import Plan, read_hf_config
from builders.spec import ResolvedBuild
from pipeline.cache import StageResult, library_versions, run_stage, stage_key
from plugins.architectures import architecture
from plugins.errors import PipelineError, StageError
from plugins.fsutil import build_lock, cache_root, check_writable, measure, write_failures_reported, write_json
from plugins.targets import TargetProfile, get_target

log = logging.getLogger("trtpipe")

SERVED_STAGES = ("model_repo", "bundle")
"""Stages whose output a server runs; the deploy stage follows whichever of them the build produced."""


@dataclass(frozen=True)
class BuildContext:
    """What every stage receives: the resolved build, its target, its one plan and the source model.

    Attributes:
        build: the spec resolved for one target.
        target: the hardware profile.
        plan: the plan computed once by builders.preflight.make_plan.
        hf_dir: the source Hugging Face checkpoint folder.
        digest: SHA-256 of the source checkpoint's files.
        out: the build folder (``build/<name>/<target>``).
        versions: library versions (pipeline.cache.library_versions).
        toolchain: the trtllm-build to run (None: TensorRT-LLM is absent, the trtllm runtime writes a bundle).
        force: rerun every stage.
        progress: show progress bars.
    """

    build: ResolvedBuild
    target: TargetProfile
    plan: Plan
    hf_dir: Path
    digest: str
    out: Path
    versions: dict
    toolchain: Optional[Toolchain] = None
    force: bool = False
    progress: bool = True


def run_build(build: ResolvedBuild, *, out_root: Path | None = None, variant: str | None = None,
              force: bool = False, progress: bool = True, stop_after: str | None = None,
              toolchain: Toolchain | None = None) -> dict:
    """Run every stage for ``build`` and write ``plan.json`` and ``manifest.json``; return the manifest.

    Args:
        build: the resolved spec for one target.
        out_root: folder under which ``<name>/<target>`` is created (default ``build/``).
        variant: suffix of the target folder (e.g. the ``--quant`` override) so variants coexist.
        force: rerun every stage even when its key matches.
        progress: show progress bars for calibration.
        stop_after: ``checkpoint``/``verify``/``engine`` to stop early.
        toolchain: the trtllm-build to run for the trtllm runtime (default: the one installed here,
            builders.engine_trtllm.installed_toolchain; none installed: the GPU-host bundle).

    Raises:
        SpecError: the spec contradicts the target or the model (before any heavy work).
        WriteError: the output root or the cache cannot be written (read-only, a file in the way; before any heavy
            work), or the disk filled up while writing (completed stages stay valid).
        StageError: a stage failed; completed stages stay valid, the failed one leaves nothing.
    """
    t_start = time.time()
    target = get_target(build.target)
    # cheap checks first: nothing heavy runs on a bad spec (a local config.json joins them: all problems at once)
    local_config = model_fetch.local_hf_config(build.model.source, build.model.revision)
    preflight.check(build, target, local_config)
    build, _ = prequant.source_quantization(build, local_config)  # a pre-quantized source: its quantization
    out = build_dir(build, out_root, variant)
    check_writable(out, "the build folder")  # a read-only output root fails now, not after the calibration
    check_writable(cache_root(), "the cache ($TRTPIPE_CACHE)")  # the build lock lives there
    if toolchain is None and build.runtime.builds_trt_engine:
        from builders.engine_trtllm import installed_toolchain

        toolchain = installed_toolchain()
    # The model's rules too, before waiting for another build of the same folder: a bad model fails now.
    with measure("model") as t_model:
        hf_dir = model_fetch.resolve_source(build.model.source, build.model.revision, progress=progress)
        hf_config = read_hf_config(hf_dir)
        build, source_quant = prequant.source_quantization(build, hf_config, hf_dir)
        # with the folder: a checkpoint missing tensors its config.json implies is refused here, not quantized
        plan = preflight.make_plan(build, target, hf_config, spec_checked=True, hf_dir=hf_dir)
        if source_quant is not None and build.model.reference:  # fetched once the rules pass, before any stage
            model_fetch.resolve_source(build.model.reference, field="model.reference", progress=progress)
    # one build at a time per output folder (a second one waits); a full disk is reported with its path and fix
    with write_failures_reported(out, "the build"), build_lock(out):
        versions = library_versions()
        manifest: dict = {"build": build.name, "target": build.target, "runtime": build.settings.runtime,
                          "spec_path": build.spec_path, "settings": build.settings.model_dump(mode="json"),
                          "model_source": build.model.source, "trust_remote_code": build.model.trust_remote_code,
                          "versions": versions, "host": platform.node(),
                          "stages": {}}
        with measure("model") as t_digest:
            plan.write(out / "plan.json")  # beside manifest.json
            digest = source_digest(hf_dir)  # memoised: a no-op rebuild does not re-hash the weights
        manifest["source_checkpoint"] = {"path": str(hf_dir), "sha256": digest,
                                         **({"quantization": source_quant.record()} if source_quant else {}),
                                         **_hub_record(build, hf_dir, out / "manifest.json")}
        model_timing = t_model.as_dict()
        model_timing["wall_s"] = round(model_timing["wall_s"] + t_digest.wall_s, 3)
        manifest["stages"]["model"] = {"path": str(hf_dir), "timing": model_timing}
        ctx = BuildContext(build, target, plan, hf_dir, digest, out, versions, toolchain, force, progress)

        results = [checkpoint_stage(ctx)]
        ckpt = results[0]
        manifest["calibration"] = {k: ckpt.info.get(k) for k in ("calibration_s", "calibration_peak_rss_mib",
                                                                 "calibration_samples")}
        if stop_after != "checkpoint":
            results.append(verify_stage(ctx, ckpt))
        if stop_after not in ("checkpoint", "verify"):
            results.append(ENGINE_STAGES[build.runtime.engine](ctx, ckpt))
            if stop_after != "engine" and results[-1].name != "bundle":
                results.append(repository_stage(ctx, results[-1]))
            if results[-1].name in SERVED_STAGES:  # the repository (or the GPU-host bundle) exists: how to run it
                results.append(deploy_stage(ctx, results[-1].name))
        bundle = next((r for r in results if r.name == "bundle"), None)
        if bundle is not None:
            manifest["handoff"] = {"bundle": str(bundle.path),
                                   "script": str(bundle.path / "build_and_serve.sh"),
                                   "reason": "TensorRT-LLM is not importable on this machine"}
        for r in results:
            manifest["stages"][r.name] = r.record()
        manifest["wall_s"] = round(time.time() - t_start, 3)
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_json(out / "manifest.json", manifest)
        return manifest


def _hub_record(build: ResolvedBuild, hf_dir: Path, previous_manifest: Path) -> dict:
    """For a Hugging Face Hub source, what the manifest records beside the folder and digest
    (builders.hub.snapshot_record: repo_id, the revision asked for, the commit it resolved to, each file's hash),
    plus ``previous_commit`` and a warning when the last build of this folder (``previous_manifest``) used another
    commit of the same revision; {} for other sources."""
    from builders import hub

    if not hub.is_hub_source(build.model.source):
        return {}
    record = hub.snapshot_record(hf_dir, build.model.revision)
    try:
        previous = json.loads(previous_manifest.read_text()).get("source_checkpoint")
    except (OSError, ValueError, AttributeError):
        previous = None
    moved = hub.moved_message(previous, record)
    if moved:
        log.warning(moved)
        record["previous_commit"] = previous["commit"]
    return record


def _progress_factory(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    def make(desc: str, total: int):
        return tqdm(total=total, desc=f"  {desc}", unit="seq", leave=True)

    return make


def checkpoint_stage(ctx: BuildContext) -> StageResult:
    """ModelOpt quantization + export: the TensorRT-LLM checkpoint, or the unified HF checkpoint (llmapi)."""
    from builders.calibration import token_windows
    from builders.quantize import needs_calibration, quantize_to_checkpoint

    build = ctx.build
    s, fmt = build.settings, ctx.plan.checkpoint_format
    q = s.quantization
    sq = ctx.plan.source_quantization
    if sq is not None and build.runtime.builds_trt_engine and ctx.toolchain is not None:
        return _convert_prequantized(ctx)  # AutoAWQ / AutoGPTQ: upstream converts it into a TensorRT-LLM checkpoint
    if sq is not None:  # already quantized: the source is the checkpoint, as it is (the bundle converts it there)
        key = stage_key(stage="checkpoint", format="source", source=ctx.digest,
                        quantization=ctx.plan.source_quantization)
        log.info("%-10s skipped: model.source is already quantized (%s); its files are the checkpoint",
                 "checkpoint", ctx.plan.source_quantization["quant_algo"])
        return StageResult("checkpoint", ctx.hf_dir, key, True, {},
                           {"skipped": "model.source is already quantized", "format": "source",
                            "source_quantization": ctx.plan.source_quantization})
    decoder_type = build.model.decoder_type or architecture(ctx.plan.model.architecture).decoder_type
    key = stage_key(stage="checkpoint", format=fmt, source=ctx.digest, spec=build.key_fields("checkpoint"),
                    decoder_type=decoder_type,
                    modelopt=ctx.versions["nvidia-modelopt"], torch=ctx.versions["torch"],
                    transformers=ctx.versions["transformers"],
                    **({"tokenizer": TOKENIZER_COMPAT} if fmt == "hf_unified" else {}))

    def produce(tmp: Path) -> dict:
        samples: list = []
        if needs_calibration(q.quant_algo, q.kv_cache_quant_algo):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(ctx.hf_dir), trust_remote_code=build.model.trust_remote_code)
            c = q.calibration
            samples = token_windows(tok, "calibration", c.num_samples, c.seq_len, c.seed, c.dataset)
        if fmt == "hf_unified":
            from builders.quantize_hf import quantize_to_hf_checkpoint

            return quantize_to_hf_checkpoint(
                ctx.hf_dir, tmp, quant_algo=q.quant_algo, group_size=q.group_size,
                kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, calib_samples=samples,
                progress=_progress_factory(ctx.progress), trust_remote_code=build.model.trust_remote_code)
        return quantize_to_checkpoint(
            ctx.hf_dir, tmp, quant_algo=q.quant_algo, group_size=q.group_size,
            kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, tp_size=s.parallelism.tp_size,
            pp_size=s.parallelism.pp_size, decoder_type=decoder_type, calib_samples=samples,
            progress=_progress_factory(ctx.progress), trust_remote_code=build.model.trust_remote_code)

    return run_stage("checkpoint", ctx.out / "checkpoint", key, produce, force=ctx.force)


def _convert_prequantized(ctx: BuildContext) -> StageResult:
    """The checkpoint stage of an AutoAWQ/AutoGPTQ source on the engine path with TensorRT-LLM installed: upstream's
    from_hugging_face writes the TensorRT-LLM checkpoint (builders.prequant_trtllm)."""
    from builders import prequant_trtllm
    from builders.prequant import Prequantized

    build, sq = ctx.build, ctx.plan.source_quantization
    pq = Prequantized.from_record(sq)
    decoder_type = build.model.decoder_type or architecture(ctx.plan.model.architecture).decoder_type
    par = build.settings.parallelism
    spec = prequant_trtllm.convert_spec(pq, decoder_type=decoder_type, dtype=build.settings.dtype,
                                        tp_size=par.tp_size, pp_size=par.pp_size)
    key = stage_key(stage="checkpoint", format="trtllm", source=ctx.digest, convert=spec,
                    toolchain=ctx.toolchain.versions)
    return run_stage("checkpoint", ctx.out / "checkpoint", key, lambda tmp: prequant_trtllm.convert(
        ctx.hf_dir, tmp, spec, python=ctx.toolchain.python or sys.executable), force=ctx.force)


def verify_stage(ctx: BuildContext, ckpt: StageResult) -> StageResult:
    """Dequantize + merge the checkpoint, score it (and each LoRA adapter on it) against the source, apply ``gates``
    (verify/verify.json).

    A failed gate raises before the folder is renamed into place, and a verify folder left by
    an earlier run with other inputs is removed, so no stale verdict survives a failure.
    """
    from builders.verify import verify_checkpoint

    s = ctx.build.settings
    adapters = _adapters(ctx)
    reference, ref_key = _reference(ctx)
    key = stage_key(stage="verify", checkpoint=ckpt.key, spec=ctx.build.key_fields("verify"), **_adapters_key(adapters),
                    **ref_key)

    def produce(tmp: Path) -> dict:
        # a pre-quantized source is scored as it is (a TensorRT-LLM checkpoint converted from it holds the same
        # weights, repacked for the engine's kernels)
        scored = ctx.hf_dir if ctx.plan.source_quantization is not None else ckpt.path
        report = verify_checkpoint(scored, ctx.hf_dir, s.gates, dataset=s.quantization.calibration.dataset,
                                   out_json=tmp / "verify.json", trust_remote_code=ctx.build.model.trust_remote_code,
                                   adapters=adapters, reference=reference)
        return {"reference": report["reference"], **({"note": report["note"]} if "note" in report else {}),
                "metrics": report["metrics"], "gates": report["gates"], "passed": report["passed"],
                **({"adapters": {k: {"metrics": v["metrics"], "passed": v["passed"]}
                                 for k, v in report["adapters"].items()}} if "adapters" in report else {})}

    try:
        return run_stage("verify", ctx.out / "verify", key, produce, force=ctx.force)
    except StageError:
        shutil.rmtree(ctx.out / "verify", ignore_errors=True)
        raise


def _reference(ctx: BuildContext) -> tuple:
    """What verify scores the checkpoint against, and its part of the verify key: the source itself (``"source"``);
    for a pre-quantized source, ``model.reference`` fetched (builders.model_fetch.resolve_source) or None."""
    if ctx.plan.source_quantization is None:
        return "source", {}
    ref = ctx.build.model.reference
    if not ref:
        return None, {"reference": None}
    folder = model_fetch.resolve_source(ref, field="model.reference")
    return folder, {"reference": source_digest(folder)}


def pytorch_engine_stage(ctx: BuildContext, ckpt: StageResult) -> StageResult:
    """The portable runtime's engine: the checkpoint merged and dequantized into HF layout, and engine.json."""
    from builders.engine_pytorch import build_pytorch_engine

    adapters = _adapters(ctx)
    key = stage_key(stage="engine", checkpoint=ckpt.key, spec=ctx.build.key_fields("engine"),
                    torch=ctx.versions["torch"], transformers=ctx.versions["transformers"], tokenizer=TOKENIZER_COMPAT,
                    **_adapters_key(adapters))

    def produce(tmp: Path) -> dict:
        from builders.lora import write_adapters

        info = build_pytorch_engine(ckpt.path, ctx.hf_dir, tmp, limits=ctx.plan.limits)
        table = write_adapters(adapters, tmp)
        return {**info, "lora_adapters": table} if table else info

    return run_stage("engine", ctx.out / "engine", key, produce, force=ctx.force)


def _adapters(ctx: BuildContext) -> list:
    """The build's LoRA adapters (builders.lora.Adapter; [] without lora.adapters), read again as the plan names
    them (builders.lora.adapters_of)."""
    from builders.lora import adapters_of

    return adapters_of(ctx.plan.lora)


def _adapters_key(adapters: list) -> dict:
    """The stage-key entry of the adapters' content (none without adapters: keys of builds without LoRA unchanged)."""
    from builders.lora import adapters_digest

    return {"lora": adapters_digest(adapters)} if adapters else {}


def llmapi_engine_stage(ctx: BuildContext, ckpt: StageResult) -> StageResult:
    """The LLM API serves the unified HF checkpoint itself: the "engine" is that folder plus limits, and the LoRA
    adapters of ``lora.adapters`` copied into ``lora/`` with their table (builders.lora.write_adapters); the key holds the
    adapters' content digest, so an adapter retrained in place rebuilds the folder."""
    from builders.quantize_hf import prepare_llmapi_engine

    adapters = _adapters(ctx)
    key = stage_key(stage="engine", checkpoint=ckpt.key, spec=ctx.build.key_fields("engine"),
                    tokenizer=TOKENIZER_COMPAT, **_adapters_key(adapters))

    def produce(tmp: Path) -> dict:
        from builders.lora import write_adapters

        info = prepare_llmapi_engine(ckpt.path, ctx.hf_dir, tmp, limits=ctx.plan.limits)
        table = write_adapters(adapters, tmp)
        return {**info, "lora_adapters": table} if table else info

    return run_stage("engine", ctx.out / "engine", key, produce, force=ctx.force)


def trtllm_engine_stage(ctx: BuildContext, ckpt: StageResult) -> StageResult:
    """trtllm-build here when a toolchain is given or installed; otherwise the GPU-host bundle."""
    from builders import engine_trtllm as et

    build, target, plan = ctx.build, ctx.target, ctx.plan
    plugins = plan.plugins
    # What determines the engine: the checkpoint, limits, plugin flags, the TensorRT-LLM release and
    # the GPU architecture. Not the worker count, log level, progress display or output paths.
    engine_inputs = dict(checkpoint=ckpt.key, spec=build.key_fields("engine"),
                         plugins=[p.cli() for p in plugins if not p.implicit], sm=target.sm)
    engine_inputs.update(_adapters_key(_adapters(ctx)))  # the engine (or bundle) holds the converted adapters
    if ctx.toolchain is None:
        from model_repo.bundle import write_bundle

        key = stage_key(stage="bundle", tensorrt_llm=TRTLLM_VERSION, bundle=build.key_fields("bundle"),
                        templates=templates_digest(), tokenizer=TOKENIZER_COMPAT, **engine_inputs)
        final = ctx.out / "bundle"
        result = run_stage("bundle", final, key, lambda tmp: write_bundle(
            tmp, final, build=build, target=target, plan=plan, ckpt_dir=ckpt.path, hf_dir=ctx.hf_dir,
            stage_keys={"checkpoint": ckpt.key, "bundle": key}), force=ctx.force)
        _print_handoff(ctx, ckpt, result)
        return result
    et.check_toolchain(ctx.toolchain)
    key = stage_key(stage="engine", toolchain=ctx.toolchain.versions, tokenizer=TOKENIZER_COMPAT, **engine_inputs)
    timing_cache = cache_root() / "trtllm-timing" / f"sm{target.sm}-trtllm{ctx.toolchain.tensorrt_llm}.cache"
    return run_stage("engine", ctx.out / "engine", key, lambda tmp: et.build_trtllm_engine(
        ckpt_dir=ckpt.path, hf_dir=ctx.hf_dir, out_dir=tmp, limits=plan.limits, plugins=plugins,
        world_size=build.world_size, timing_cache=timing_cache, toolchain=ctx.toolchain,
        progress=ctx.progress, lora=plan.lora, dtype=plan.dtype), force=ctx.force)


ENGINE_STAGES: dict[str, Callable[[BuildContext, StageResult], StageResult]] = {
    "pytorch": pytorch_engine_stage, "trtllm-build": trtllm_engine_stage, "llmapi": llmapi_engine_stage}
"""The engine stage of each runtime's ``engine`` trait (plugins.runtimes)."""


def repository_stage(ctx: BuildContext, engine: StageResult) -> StageResult:
    """The Triton model repository for the engine (model_repo.generate), every value from the plan."""
    from model_repo.generate import default_sys_path, plan_repository, write_repository

    kv_pool = ctx.plan.memory.kv.capacity_tokens
    key = stage_key(stage="model_repo", engine=engine.key, spec=ctx.build.key_fields("model_repo"),
                    target=ctx.target.model_dump(mode="json"), templates=templates_digest(),
                    sys_path=default_sys_path(), engine_dir=str(engine.path), kv_pool=kv_pool)

    def produce(tmp: Path) -> dict:
        tok = engine.path / "tokenizer"  # trtllm-build engines keep the tokenizer in a subfolder
        repo = plan_repository(ctx.build, ctx.target, ctx.plan, engine.path, engine=engine.info,
                               tokenizer_dir=tok if tok.is_dir() else None)
        configs = write_repository(repo, tmp, atomic=False)
        return {"models": sorted(configs)}

    return run_stage("model_repo", ctx.out / "model_repo", key, produce, force=ctx.force)


def deploy_stage(ctx: BuildContext, served_from: str) -> StageResult:
    """docker-compose.yaml and k8s/*.yaml for running ``served_from`` (model_repo or bundle) on a GPU host."""
    return _deploy(ctx.build, ctx.target, served_from, ctx.out, ctx.force)


def _deploy(build: ResolvedBuild, target: TargetProfile, served_from: str, out: Path, force: bool) -> StageResult:
    """Keyed on what the files hold (model_repo.deploy.plan_deployment): runtime, parallelism, ports,
    the target's GPUs per node, the image, the mount path and the generator's source; not on the
    repository's or engine's keys (a KV-cache or limit change leaves the deployment as it is)."""
    from model_repo import deploy

    plan = deploy.plan_deployment(build, target, out, served_from=served_from)
    key = stage_key(stage="deploy", plan=plan.as_dict(),
                    generator=hashlib.sha256(Path(deploy.__file__).read_bytes()).hexdigest())

    def produce(tmp: Path) -> dict:
        files = deploy.write_deployment(plan, tmp)
        return {"files": [str(f.relative_to(tmp)) for f in files], "image": plan.image,
                "served_from": plan.served_from, "nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node}

    return run_stage("deploy", out / "deploy", key, produce, force=force)


def deploy_build(build: ResolvedBuild, *, out_root: Path | None = None, variant: str | None = None,
                 force: bool = False) -> StageResult:
    """(Re)write ``deploy/`` for a build that exists, and record it in its manifest.json.

    Raises:
        PipelineError: the build folder has neither ``model_repo/`` nor ``bundle/`` (not built yet).
        WriteError: the build folder cannot be written (read-only, disk full).
    """
    target = get_target(build.target)
    out = build_dir(build, out_root, variant)
    manifest_path = out / "manifest.json"
    recorded = json.loads(manifest_path.read_text()).get("stages", {}) if manifest_path.is_file() else {}
    # What the last build served (its manifest), else whichever finished stage folder exists.
    served = ([name for name in SERVED_STAGES if name in recorded and (out / name / "stage.json").is_file()]
              or [name for name in SERVED_STAGES if (out / name / "stage.json").is_file()])
    if not served:
        flags = f" --quant {variant}" if variant else ""
        raise PipelineError(f"{out} holds no built model repository or bundle (looked for "
                            f"{' and '.join(f'{n}/stage.json' for n in SERVED_STAGES)}): build it first with "
                            f"`trtpipe build {build.spec_path} --target {build.target}{flags}`")
    check_writable(out / "deploy", "the deployment folder")
    with write_failures_reported(out, "the deploy stage"), build_lock(out):
        result = _deploy(build, target, served[0], out, force)
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            manifest.setdefault("stages", {})["deploy"] = result.record()
            write_json(manifest_path, manifest)
    return result


def templates_digest() -> str:
    """SHA-256 of what writes a repository: the templates, the support package every model imports
    (trtpipe_runtime) and the generator itself (its tensor tables and values reach every config.pbtxt)."""
    import model_repo.generate as generate

    files = [p for p in sorted(generate.TEMPLATES.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    files += [*generate.runtime_package_files(), Path(generate.__file__)]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def _print_handoff(ctx: BuildContext, ckpt: StageResult, bundle: StageResult) -> None:
    """Say clearly why the engine was not built here and what to run on the GPU host."""
    build, target, world = ctx.build, ctx.target, ctx.build.world_size
    par = build.settings.parallelism
    state = "up to date" if bundle.cached else "written"
    sq = ctx.plan.source_quantization
    made = (f"model.source, already quantized ({sq['method']} {sq['quant_algo']})" if sq else
            f"ModelOpt {build.settings.quantization.quant_algo}") + f", tp {par.tp_size} x pp {par.pp_size}"
    step = "convert the checkpoint with TensorRT-LLM, " if sq else ""
    print(f"""
TensorRT-LLM {TRTLLM_VERSION} is not importable here, so the engine for target '{target.name}' (SM {target.sm}) \
was not built on this machine.
Produced:
  checkpoint  {ckpt.path}  ({made})
  bundle      {bundle.path}  ({state}: {'source' if sq else 'checkpoint'}, tokenizer, Triton repository for the \
tensorrtllm backend, plan.json, build_and_serve.sh)
On a GPU host with {world} x {target.name} GPU(s) and TensorRT-LLM {TRTLLM_VERSION} (e.g. the NGC Triton TRT-LLM \
container), copy the bundle folder and run:
  ./build_and_serve.sh          # {step}trtllm-build, check the engine, then serve with tritonserver (mpirun, \
{world} rank(s))
See docs/gpu-hosts.md.""", flush=True)
