"""The build: spec -> quantized TensorRT-LLM checkpoint -> engine -> Triton model repository.

Each stage is a function of its inputs. Its output folder carries a ``stage.json`` with the
stage's key, a hash of exactly the inputs that determine the output (spec fields that
matter, the source checkpoint digest, library versions, the upstream stage's key); the
folder is written under a temporary name and renamed when complete, so a folder that
exists is a finished stage. A rerun whose key matches reuses the folder and says so; a
changed field reruns only the stages downstream of it.

Outputs: ``build/<name>/<target>/{checkpoint,verify,engine,model_repo,deploy}/`` (``bundle/`` instead of
``engine``/``model_repo`` for the trtllm runtime where TensorRT-LLM is not installed) and ``manifest.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from builders.model_fetch import TOKENIZER_COMPAT
from pipeline.digest import source_digest
from pipeline.errors import StageError
from pipeline.fsutil import REPO_ROOT, atomic_dir, build_lock, cache_root, measure, write_json
from pipeline.spec import ResolvedBuild
from pipeline.targets import TargetProfile, get_target

log = logging.getLogger("trtpipe")

BUILD_ROOT = REPO_ROOT / "build"
# Stages whose output a server runs; the deploy stage follows whichever of them the build produced.
SERVED_STAGES = ("model_repo", "bundle")


def build_dir(build: ResolvedBuild, root: Path | None = None, variant: str | None = None) -> Path:
    """``<root>/<name>/<target>[-<variant>]``: where a build's outputs live."""
    leaf = build.target if not variant else f"{build.target}-{variant}"
    return (root or BUILD_ROOT) / build.name / leaf


def stage_key(**parts) -> str:
    """SHA-256 (first 16 hex digits) of the JSON of ``parts`` with sorted keys."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes the artifacts."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "nvidia-modelopt", "safetensors", "tritonclient", "tensorrt-llm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class StageResult:
    name: str
    path: Path
    key: str
    cached: bool
    timing: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)


def run_stage(name: str, out: Path, key: str, produce: Callable[[Path], dict], *, force: bool = False) -> StageResult:
    """Run ``produce(tmp_dir)`` unless ``out/stage.json`` already has ``key``.

    ``produce`` fills the temporary folder and returns a dict of facts for the manifest.
    """
    marker = out / "stage.json"
    _remove_stale_temps(out)
    if not force and marker.is_file():
        prev = json.loads(marker.read_text())
        if prev.get("key") == key:
            log.info("%-10s up to date (key %s), reusing %s", name, key, out)
            return StageResult(name, out, key, True, prev.get("timing", {}), prev.get("info", {}))
    log.info("%-10s running -> %s", name, out)
    with measure(name) as timing, atomic_dir(out) as tmp:
        info = produce(tmp) or {}
        (tmp / "stage.json").write_text(json.dumps({"stage": name, "key": key, "info": info}, default=str))
    record = {"stage": name, "key": key, "timing": timing.as_dict(), "info": info}
    write_json(marker, record)
    log.info("%-10s done in %.1f s (peak RSS %.0f MiB)", name, timing.wall_s, timing.peak_rss_bytes / 2**20)
    return StageResult(name, out, key, False, timing.as_dict(), info)


def _remove_stale_temps(out: Path) -> None:
    """Delete ``.<stage>.tmp-*`` / ``.<stage>.old-*`` siblings left by a build that was killed mid-stage.

    They are never read (a stage folder without ``stage.json`` is never reused either); this only
    frees their space. Builds of one output folder are serialised by fsutil.build_lock, so no running
    build owns them.
    """
    import shutil

    if not out.parent.is_dir():
        return
    for stale in list(out.parent.glob(f".{out.name}.tmp-*")) + list(out.parent.glob(f".{out.name}.old-*")):
        log.info("%-10s removing %s left by an interrupted build", out.name, stale.name)
        shutil.rmtree(stale, ignore_errors=True)


def _progress_factory(enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    def make(desc: str, total: int):
        return tqdm(total=total, desc=f"  {desc}", unit="seq", leave=True)

    return make


def run_build(build: ResolvedBuild, *, out_root: Path | None = None, variant: str | None = None,
              force: bool = False, progress: bool = True, stop_after: str | None = None) -> dict:
    """Run every stage for ``build`` and write ``manifest.json``; return the manifest.

    Args:
        build: the resolved spec for one target.
        out_root: folder under which ``<name>/<target>`` is created (default ``build/``).
        variant: suffix of the target folder (e.g. the ``--quant`` override) so variants coexist.
        force: rerun every stage even when its key matches.
        progress: show progress bars for calibration.
        stop_after: ``checkpoint``/``verify``/``engine`` to stop early.

    Raises:
        SpecError: the spec contradicts the target or the model (before any heavy work).
        StageError: a stage failed; completed stages stay valid, the failed one leaves nothing.
    """
    from builders import model_fetch
    from pipeline import preflight

    t_start = time.time()
    target = get_target(build.target)
    preflight.check(build, target)  # cheap checks first: nothing heavy runs on a bad spec
    out = build_dir(build, out_root, variant)
    # The model's own rules too, before waiting for another build of the same folder: a bad model fails now.
    preflight.check_model(build, target, model_fetch.resolve_source(build.model.source))
    with build_lock(out):  # one build at a time per output folder (a second one waits)
        s = build.settings
        versions = library_versions()
        manifest: dict = {"build": build.name, "target": build.target, "runtime": s.runtime,
                          "spec_path": build.spec_path, "settings": s.model_dump(mode="json"),
                          "model_source": build.model.source, "versions": versions, "host": platform.node(),
                          "stages": {}}

        with measure("model") as t_model:
            hf_dir = model_fetch.resolve_source(build.model.source)
            preflight.check_model(build, target, hf_dir)
            from pipeline.plan import compute_plan, read_hf_config

            compute_plan(build, target, read_hf_config(hf_dir)).write(out / "plan.json")  # beside manifest.json
            digest = source_digest(hf_dir)  # memoised: a no-op rebuild does not re-hash the weights
        manifest["source_checkpoint"] = {"path": str(hf_dir), "sha256": digest}
        manifest["stages"]["model"] = {"path": str(hf_dir), "timing": t_model.as_dict()}

        results = [_checkpoint_stage(build, hf_dir, digest, out, versions, force, progress)]
        ckpt = results[0]
        manifest["calibration"] = {k: ckpt.info.get(k) for k in ("calibration_s", "calibration_peak_rss_mib",
                                                                 "calibration_samples")}
        if stop_after != "checkpoint":
            if _checkpoint_format(build) == "trtllm":  # the unified HF export (llmapi) has no rank shards to read
                results.append(_verify_stage(build, hf_dir, ckpt, out, force))
        if stop_after not in ("checkpoint", "verify"):
            results.append(_engine_stage(build, target, hf_dir, ckpt, out, versions, force, progress))
            if stop_after != "engine" and results[-1].name != "bundle":
                results.append(_package_stage(build, target, results[-1], out, force))
            if results[-1].name in SERVED_STAGES:  # the repository (or the GPU-host bundle) exists: how to run it
                results.append(_deploy_stage(build, target, results[-1].name, out, force))
        bundle = next((r for r in results if r.name == "bundle"), None)
        if bundle is not None:
            manifest["handoff"] = {"bundle": str(bundle.path),
                                   "script": str(bundle.path / "build_and_serve.sh"),
                                   "reason": "TensorRT-LLM is not importable on this machine"}
        for r in results:
            manifest["stages"][r.name] = {"path": str(r.path), "key": r.key, "cached": r.cached,
                                          "timing": r.timing, "info": r.info}
        manifest["wall_s"] = round(time.time() - t_start, 3)
        manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_json(out / "manifest.json", manifest)
        return manifest


def _checkpoint_format(build: ResolvedBuild) -> str:
    """``hf_unified`` (ModelOpt unified HF export) for the LLM-API runtime, else the TensorRT-LLM checkpoint."""
    return "hf_unified" if build.settings.runtime == "trtllm-llmapi" else "trtllm"


def _checkpoint_stage(build, hf_dir, digest, out, versions, force, progress) -> StageResult:
    from builders.calibration import token_windows
    from builders.quantize import needs_calibration, quantize_to_checkpoint

    s = build.settings
    q = s.quantization
    fmt = _checkpoint_format(build)
    key = stage_key(stage="checkpoint", format=fmt, source=digest, quant=q.model_dump(mode="json"), dtype=s.dtype,
                    tp=s.parallelism.tp_size, pp=s.parallelism.pp_size, decoder=build.model.decoder_type,
                    modelopt=versions["nvidia-modelopt"], torch=versions["torch"],
                    transformers=versions["transformers"],
                    **({"tokenizer": TOKENIZER_COMPAT} if fmt == "hf_unified" else {}))

    def produce(tmp: Path) -> dict:
        samples: list = []
        if needs_calibration(q.quant_algo, q.kv_cache_quant_algo):
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(hf_dir))
            c = q.calibration
            samples = token_windows(tok, "calibration", c.num_samples, c.seq_len, c.seed, c.dataset)
        if fmt == "hf_unified":
            from builders.quantize_hf import quantize_to_hf_checkpoint

            return quantize_to_hf_checkpoint(
                hf_dir, tmp, quant_algo=q.quant_algo, group_size=q.group_size,
                kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, calib_samples=samples,
                progress=_progress_factory(progress))
        return quantize_to_checkpoint(
            hf_dir, tmp, quant_algo=q.quant_algo, group_size=q.group_size,
            kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, tp_size=s.parallelism.tp_size,
            pp_size=s.parallelism.pp_size, decoder_type=build.model.decoder_type, calib_samples=samples,
            progress=_progress_factory(progress))

    return run_stage("checkpoint", out / "checkpoint", key, produce, force=force)


def _verify_stage(build, hf_dir, ckpt: StageResult, out, force) -> StageResult:
    """Dequantize + merge the checkpoint, score it against the source, apply ``gates`` (verify/verify.json).

    A failed gate raises before the folder is renamed into place, and a verify folder left by
    an earlier run with other inputs is removed, so no stale verdict survives a failure.
    """
    import shutil

    from builders.verify import verify_checkpoint

    s = build.settings
    key = stage_key(stage="verify", checkpoint=ckpt.key, gates=s.gates.model_dump(mode="json"),
                    dataset=s.quantization.calibration.dataset)

    def produce(tmp: Path) -> dict:
        report = verify_checkpoint(ckpt.path, hf_dir, s.gates, dataset=s.quantization.calibration.dataset,
                                   out_json=tmp / "verify.json")
        return {"metrics": report["metrics"], "gates": report["gates"], "passed": report["passed"]}

    try:
        return run_stage("verify", out / "verify", key, produce, force=force)
    except StageError:
        shutil.rmtree(out / "verify", ignore_errors=True)
        raise


def _build_config(build: ResolvedBuild) -> dict:
    lim = build.settings.limits
    return {k: getattr(lim, k) for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens",
                                         "max_beam_width", "tokens_per_block")}


def _engine_stage(build, target: TargetProfile, hf_dir, ckpt: StageResult, out, versions, force,
                  progress: bool = True) -> StageResult:
    s = build.settings
    if s.runtime == "trtllm":
        return _trtllm_engine_stage(build, target, hf_dir, ckpt, out, force, progress)
    if s.runtime == "trtllm-llmapi":
        return _llmapi_engine_stage(build, hf_dir, ckpt, out, force)
    from builders.engine_pytorch import build_pytorch_engine

    key = stage_key(stage="engine", runtime=s.runtime, checkpoint=ckpt.key, limits=_build_config(build),
                    torch=versions["torch"], transformers=versions["transformers"], tokenizer=TOKENIZER_COMPAT)
    return run_stage("engine", out / "engine", key,
                     lambda tmp: build_pytorch_engine(ckpt.path, hf_dir, tmp, build_config=_build_config(build)),
                     force=force)


def _package_stage(build, target: TargetProfile, engine: StageResult, out, force) -> StageResult:
    from model_repo.generate import default_sys_path, plan_repository, write_repository

    s = build.settings
    kv_pool = _planned_kv_tokens(out / "plan.json")
    key = stage_key(stage="model_repo", engine=engine.key, serving=s.serving.model_dump(mode="json"),
                    target=target.model_dump(mode="json"), templates=_templates_digest(),
                    sys_path=default_sys_path(), engine_dir=str(engine.path), kv_pool=kv_pool)

    def produce(tmp: Path) -> dict:
        tok = engine.path / "tokenizer"  # trtllm-build engines keep the tokenizer in a subfolder
        plan = plan_repository(build, target, engine.path, tokenizer_dir=tok if tok.is_dir() else None,
                               kv_pool_tokens=kv_pool)
        configs = write_repository(plan, tmp, atomic=False)
        return {"models": sorted(configs)}

    return run_stage("model_repo", out / "model_repo", key, produce, force=force)


def _deploy_stage(build, target: TargetProfile, served_from: str, out: Path, force: bool) -> StageResult:
    """docker-compose.yaml and k8s/*.yaml for running ``served_from`` (model_repo or bundle) on a GPU host.

    Keyed on what the files hold (model_repo.deploy.plan_deployment): runtime, parallelism, ports,
    the target's GPUs per node, the image, the mount path and the generator's source; not on the
    repository's or engine's keys (a KV-cache or limit change leaves the deployment as it is).
    """
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
    """
    from pipeline.errors import PipelineError

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
    with build_lock(out):
        result = _deploy_stage(build, target, served[0], out, force)
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            manifest.setdefault("stages", {})["deploy"] = {"path": str(result.path), "key": result.key,
                                                           "cached": result.cached, "timing": result.timing,
                                                           "info": result.info}
            write_json(manifest_path, manifest)
    return result


def _planned_kv_tokens(plan_path: Path) -> int | None:
    """The planner's KV pool in tokens (plan.json memory.kv.capacity_tokens), or None without a plan."""
    if not plan_path.is_file():
        return None
    return json.loads(plan_path.read_text()).get("memory", {}).get("kv", {}).get("capacity_tokens")


def trtllm_plugins(build: ResolvedBuild, target: TargetProfile, ckpt_dir: Path | None = None) -> list:
    """The resolved trtllm-build plugin decisions for this build on this target."""
    from plugins.resolve import resolve_plugins

    s = build.settings
    arch = "LlamaForCausalLM"
    if ckpt_dir is not None and (ckpt_dir / "config.json").is_file():
        arch = json.loads((ckpt_dir / "config.json").read_text()).get("architecture", arch)
    return resolve_plugins(quant_algo=s.quantization.quant_algo, kv_cache_quant_algo=s.quantization.kv_cache_quant_algo,
                           dtype=s.dtype, sm=target.sm, tp_size=s.parallelism.tp_size, pp_size=s.parallelism.pp_size,
                           architecture=arch, tokens_per_block=s.limits.tokens_per_block,
                           enable_kv_cache_reuse=s.serving.enable_kv_cache_reuse,
                           enable_chunked_context=s.serving.enable_chunked_context,
                           use_fp8_context_fmha=s.quantization.use_fp8_context_fmha)


def _trtllm_engine_stage(build, target: TargetProfile, hf_dir, ckpt: StageResult, out, force,
                         progress: bool) -> StageResult:
    """trtllm-build here when TensorRT-LLM is importable; otherwise the GPU-host bundle."""
    from builders import engine_trtllm as et

    s = build.settings
    world = s.parallelism.tp_size * s.parallelism.pp_size
    bc = _build_config(build)
    plugins = trtllm_plugins(build, target, ckpt.path)
    # What determines the engine: the checkpoint, limits, plugin flags, the TensorRT-LLM release and
    # the GPU architecture. Not the worker count, log level, progress display or output paths.
    engine_inputs = dict(checkpoint=ckpt.key, limits=bc, plugins=[p.cli() for p in plugins if not p.implicit],
                         sm=target.sm)
    executable = et.build_executable()
    if executable is None:
        key = stage_key(stage="bundle", tensorrt_llm=et.TRTLLM_VERSION, serving=s.serving.model_dump(mode="json"),
                        templates=_templates_digest(), tokenizer=TOKENIZER_COMPAT, **engine_inputs)
        from builders.bundle_trtllm import write_bundle

        final = out / "bundle"
        result = run_stage("bundle", final, key, lambda tmp: write_bundle(
            tmp, final, build=build, target=target, ckpt_dir=ckpt.path, hf_dir=hf_dir, build_config=bc,
            plugins=plugins, world_size=world, stage_keys={"checkpoint": ckpt.key, "bundle": key}), force=force)
        _print_handoff(build, target, ckpt, result, world)
        return result
    test_double = bool(os.environ.get(et.EXECUTABLE_ENV))
    versions = et.toolchain_versions()
    et.check_toolchain(versions, test_double=test_double)
    key = stage_key(stage="engine", runtime="trtllm", tensorrt_llm=versions["tensorrt-llm"],
                    tensorrt=versions["tensorrt"], test_double=test_double, tokenizer=TOKENIZER_COMPAT,
                    **engine_inputs)
    timing_cache = cache_root() / "trtllm-timing" / f"sm{target.sm}-trtllm{versions['tensorrt-llm']}.cache"
    return run_stage("engine", out / "engine", key, lambda tmp: et.build_trtllm_engine(
        ckpt_dir=ckpt.path, hf_dir=hf_dir, out_dir=tmp, build_config=bc, plugins=plugins, world_size=world,
        timing_cache=timing_cache, executable=executable, progress=progress), force=force)


def _llmapi_engine_stage(build, hf_dir, ckpt: StageResult, out, force) -> StageResult:
    """The LLM API serves the unified HF checkpoint itself: the "engine" is that folder plus limits."""
    from builders.quantize_hf import prepare_llmapi_engine

    bc = _build_config(build)
    key = stage_key(stage="engine", runtime="trtllm-llmapi", checkpoint=ckpt.key, limits=bc,
                    tokenizer=TOKENIZER_COMPAT)
    return run_stage("engine", out / "engine", key,
                     lambda tmp: prepare_llmapi_engine(ckpt.path, hf_dir, tmp, build_config=bc), force=force)


def _templates_digest() -> str:
    """SHA-256 of what writes a repository: the templates, the spliced runtime settings and the generator
    itself (its tensor tables and values reach every config.pbtxt)."""
    import model_repo.generate as generate

    files = [p for p in sorted(generate.TEMPLATES.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    files += [generate.RUNTIME_CONFIG, Path(generate.__file__)]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


def _print_handoff(build, target, ckpt: StageResult, bundle: StageResult, world: int) -> None:
    """Say clearly why the engine was not built here and what to run on the GPU host."""
    from builders.engine_trtllm import TRTLLM_VERSION

    state = "up to date" if bundle.cached else "written"
    print(f"""
TensorRT-LLM {TRTLLM_VERSION} is not importable here, so the engine for target '{target.name}' (SM {target.sm}) \
was not built on this machine.
Produced:
  checkpoint  {ckpt.path}  (ModelOpt {build.settings.quantization.quant_algo}, tp {build.settings.parallelism.tp_size} \
x pp {build.settings.parallelism.pp_size})
  bundle      {bundle.path}  ({state}: checkpoint, tokenizer, Triton repository for the tensorrtllm backend,
              plan.json, build_and_serve.sh)
On a GPU host with {world} x {target.name} GPU(s) and TensorRT-LLM {TRTLLM_VERSION} (e.g. the NGC Triton TRT-LLM \
container), copy the bundle folder and run:
  ./build_and_serve.sh          # trtllm-build, check the engine, then serve with tritonserver (mpirun, {world} rank(s))
See docs/gpu-hosts.md.""", flush=True)
