"""``trtpipe``: the command line. Parses, prints, and calls the typed functions that do the work."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from pathlib import Path

from plugins.errors import PipelineError, Problem, SpecError
from plugins.procenv import passive_openmp
from plugins.recipes import QUANT_RECIPES

log = logging.getLogger("trtpipe")
DEFAULT_BUILD = "configs/builds/smollm2-135m.yaml"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"trtpipe {version('trtpipe')}"
    except PackageNotFoundError:
        return "trtpipe (not installed)"


def _add_build_args(p: argparse.ArgumentParser, positional: bool = True) -> None:
    if positional:
        p.add_argument("build", nargs="?", default=DEFAULT_BUILD, help=f"build YAML file (default: {DEFAULT_BUILD})")
    else:
        p.add_argument("--build", default=DEFAULT_BUILD, help=f"build YAML file (default: {DEFAULT_BUILD})")
    p.add_argument("--target", default="cpu", help="target name: a key of `targets` in the build file and a "
                                                   "profile in configs/targets/ (default: cpu)")
    p.add_argument("--quant", default=None, help=f"override quantization.quant_algo ({', '.join(QUANT_RECIPES)}); "
                                                 "outputs go to build/<name>/<target>-<quant>/")
    p.add_argument("--runtime", default=None, help="override runtime (pytorch, trtllm, trtllm-llmapi); outputs go to "
                                                   "build/<name>/<target>-<runtime>/")
    p.add_argument("--out", type=Path, default=None, help="output root (default: build/)")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """Flags of the commands that run stages (build, verify)."""
    p.add_argument("--force", action="store_true", help="rerun every stage even when up to date")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _resolve(args):
    """The build file of ``args`` resolved for ``--target`` with ``--quant`` applied (builders.layout). The
    default build file is looked for in the current directory, then under the project root, then in the
    installed package."""
    from builders.layout import resolve_build  # imported when needed: `trtpipe --help` stays fast

    if str(args.build) == DEFAULT_BUILD and not Path(DEFAULT_BUILD).is_file():
        from plugins.fsutil import project_root
        from plugins.targets import TARGETS_DIR

        found = [p for p in (project_root() / DEFAULT_BUILD, TARGETS_DIR.parent / "builds" / Path(DEFAULT_BUILD).name)
                 if p.is_file()]
        if found:
            args.build = str(found[0])
    return resolve_build(args.build, args.target, args.quant, getattr(args, "runtime", None))


def _same_build(args, verb: str, positional: bool = True) -> str:
    """The ``trtpipe <verb>`` command line for the build ``args`` name (the Makefile's targets run these; an
    installed copy has no Makefile): only the flags that differ from the defaults."""
    import shlex

    build = str(getattr(args, "build", DEFAULT_BUILD))
    parts = [_program(), verb] + ([] if build == DEFAULT_BUILD else [build] if positional else ["--build", build])
    if getattr(args, "target", "cpu") != "cpu":
        parts += ["--target", args.target]
    return shlex.join(parts + _variant_argv(args))


def _program() -> str:
    """How this user runs trtpipe: ``trtpipe`` where it is on PATH, else the script that runs now as typed from here (a
    checkout's ``.venv/bin/trtpipe``, which ``make`` runs)."""
    import shutil

    exe = Path(sys.argv[0])
    if exe.name != "trtpipe" or shutil.which("trtpipe"):
        return "trtpipe"
    try:
        return str(exe.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(exe.absolute())


def _not_built(out: Path) -> str:
    """Where outputs are looked for, for a "not built yet" error (the root is easy to miss from elsewhere)."""
    from plugins.fsutil import project_root

    return (f" (outputs live under the project root {project_root()}: $TRTPIPE_HOME, else the current directory; "
            "run from the folder you built in, or set TRTPIPE_HOME, or pass --out)")


def _variant(args):
    """The build-folder suffix of ``--quant`` / ``--runtime`` (builders.layout.variant)."""
    from builders.layout import variant

    return variant(args.quant, getattr(args, "runtime", None), args.build, args.target)


def _folder(args, build) -> Path:
    """Where that build's outputs live (``--out``, ``--quant`` variant)."""
    from builders.layout import build_dir

    return build_dir(build, args.out, _variant(args))


def cmd_build(args) -> int:
    from pipeline.build import run_build

    build = _resolve(args)
    manifest = run_build(build, out_root=args.out, variant=_variant(args), force=args.force,
                         progress=not args.no_progress)
    out = _folder(args, build)
    print(f"\nbuild {build.name} for {build.target} ({manifest['runtime']} runtime) -> {out}")
    print(f"{'stage':<12}{'wall s':>9}{'peak RSS MiB':>14}  status")
    for name, st in manifest["stages"].items():
        tm = st.get("timing", {})
        status = "skipped" if (st.get("info") or {}).get("skipped") else \
            "cached" if st.get("cached") else ("done" if name != "model" else "ready")
        print(f"{name:<12}{tm.get('wall_s', 0):>9.1f}{tm.get('peak_rss_mib', 0):>14.0f}  {status}")
    print(f"manifest: {out / 'manifest.json'}")
    if all(st.get("cached") for name, st in manifest["stages"].items() if name != "model"):
        print("up to date: every stage reused (nothing changed since the last build)")
    if "deploy" in manifest["stages"]:
        print(f"deployment files: {out / 'deploy'} (docker-compose.yaml, k8s/; see docs/deploy.md)")
    if manifest.get("handoff"):
        print(f"next: on the GPU host, run {manifest['handoff']['script']} (see docs/gpu-hosts.md)")
    elif build.runtime.openai_server and (out / "deploy" / "README.md").is_file():
        print(f"next: on a GPU host with TensorRT-LLM {build.runtime.tensorrt_llm.first_text} or later, tritonserver "
              "or trtllm-serve as "
              f"{out / 'deploy' / 'README.md'} says (where TensorRT-LLM is installed, `trtpipe serve` runs "
              "tritonserver and `trtpipe serve --server trtllm-serve` the OpenAI server)")
    else:
        query = _same_build(args, "query", positional=False)
        print(f"next: `{_same_build(args, 'serve')} --detach` then `{query} \"...\"`")
    return 0


def cmd_deploy(args) -> int:
    from pipeline.build import deploy_build

    other = OTHER_DEPLOYERS.get(args.engine)
    if other is not None:  # another serving engine's files (--engine): not Triton's
        return other(args)
    build = _resolve(args)
    out = _folder(args, build)
    if args.print:
        from model_repo.deploy import plan_deployment, render_deployment
        from plugins.targets import get_target

        if not any((out / name).is_dir() for name in ("model_repo", "bundle")):
            raise PipelineError(f"{out} is not built yet: run `trtpipe build {args.build} --target {build.target}` "
                                "first (the deployment serves its model_repo/ or bundle/)" + _not_built(out))
        for rel, text in render_deployment(plan_deployment(build, get_target(build.target), out)).items():
            print(f"# ---- deploy/{rel}")
            sys.stdout.write(text)
        return 0
    result = deploy_build(build, out_root=args.out, variant=_variant(args), force=args.force)
    state = "up to date" if result.cached else "written"
    print(f"deployment files for {build.name} on {build.target} ({result.info.get('served_from')}/, "
          f"image {result.info.get('image')}) {state}:")
    for rel in result.info.get("files", []):
        print(f"  {result.path / rel}")
    print(f"run: docker compose -f {result.path / 'docker-compose.yaml'} up    or    "
          f"kubectl apply -f {result.path / 'k8s'}/   (see docs/deploy.md)")
    return 0


def _deploy_dynamo(args) -> int:
    """``deploy --engine dynamo``: the DynamoGraphDeployment files (model_repo.dynamo), from the spec and its plan."""
    from builders.layout import build_dir, resolve_build, variant
    from model_repo import dynamo
    from plugins.fsutil import atomic_dir
    from plugins.targets import get_target

    build, target, hf_config = _plan_inputs(args)
    if build.runtime.builds_trt_engine:  # Dynamo's worker loads the HF checkpoint: the build's trtllm-llmapi variant
        print(f"runtime trtllm builds a TensorRT engine; Dynamo's TensorRT-LLM worker runs the PyTorch backend on the "
              f"unified HF checkpoint: deploying the build's trtllm-llmapi variant")
        llm = resolve_build(args.build, build.target, quant=args.quant, runtime="trtllm-llmapi")
        var = variant(args.quant, "trtllm-llmapi", args.build, build.target)
    else:
        llm, var = build, _variant(args)
    ckpt = build_dir(llm, args.out, var) / "checkpoint"
    cmd = (f"trtpipe build {args.build} --target {build.target}" + (f" --quant {args.quant}" if args.quant else "")
           + (" --runtime trtllm-llmapi" if llm is not build or args.runtime else ""))
    plan, problems = dynamo.plan_dynamo(
        llm, get_target(build.target), hf_config, disagg=args.disagg, checkpoint_folder=str(ckpt),
        build_command=cmd, router_mode=args.router_mode, kv_transfer=args.kv_transfer, replicas=args.replicas,
        prefill=(args.prefill_tp, args.prefill_pp, args.prefill_replicas),
        decode=(args.decode_tp, args.decode_pp, args.decode_replicas))
    if problems:
        raise SpecError(problems, build.spec_path, what="the Dynamo deployment")
    plan.namespace = args.namespace
    files = dynamo.render(plan)
    problems = dynamo.graph_problems(dynamo.documents(files), plan.workers[0].gpus_per_node)
    if problems:  # a bug of ours, not of the input: nothing is written
        raise SpecError(problems, build.spec_path, what="the generated Dynamo files")
    out = _folder(args, build) / "dynamo" / ("disagg" if args.disagg else "agg")
    if args.print:
        for rel, text in files.items():
            print(f"# ---- {rel}")
            sys.stdout.write(text)
        return 0
    with atomic_dir(out, marker="dgd.yaml") as tmp:
        for rel, text in files.items():
            (tmp / rel).write_text(text)
    print(f"Dynamo {dynamo.DYNAMO_VERSION} files for {build.name} on {build.target} "
          f"({'disaggregated' if args.disagg else 'aggregated'}, router {plan.router_mode}):")
    for w in plan.workers:
        print(f"  {w.name}: tp {w.tp_size} x pp {w.pp_size} = {w.gpus} GPU(s) x {w.replicas} replica(s)")
    for rel in files:
        print(f"  {out / rel}")
    print(f"next: {out / 'README.md'} (install the operator, copy {ckpt} to the volume, kubectl apply)")
    return 0


OTHER_DEPLOYERS = {"dynamo": _deploy_dynamo}
"""``deploy --engine`` values other than triton, and what writes their files."""


def cmd_verify(args) -> int:
    from builders.verify import format_table
    from pipeline.build import run_build

    build = _resolve(args)
    manifest = run_build(build, out_root=args.out, variant=_variant(args), force=args.force,
                         progress=not args.no_progress, stop_after="verify")
    out = _folder(args, build)
    report = json.loads((out / "verify" / "verify.json").read_text())
    q = manifest["settings"]["quantization"]  # a pre-quantized source's own, as the build adopted it
    source = " (model.source as it is)" if manifest["source_checkpoint"].get("quantization") else ""
    print(f"\nverify {build.name} for {build.target}: {q['quant_algo']}{source} (kv cache "
          f"{q['kv_cache_quant_algo'] or 'model dtype'}),"
          f" tp={report['mapping']['tp_size']} pp={report['mapping']['pp_size']}, "
          f"{report['evaluation']['samples']} x {report['evaluation']['seq_len']} held-out tokens")
    print(format_table(report))
    print(f"report: {out / 'verify' / 'verify.json'} ({'cached' if manifest['stages']['verify']['cached'] else 'new'})")
    return 0


def cmd_plan(args) -> int:
    from builders import preflight
    from pipeline.plan_view import render_plan

    if args.output is not None:
        _check_plan_output(Path(args.output), args.force)
    build, target, hf_config = _plan_inputs(args)
    plan = preflight.make_plan(build, target, hf_config, isl=args.isl, osl=args.osl, spec_checked=True)
    if not args.no_predict:
        plan = plan.model_copy(update={"performance": _predict(build, target, plan, hf_config, args)})
    out = args.output or (_folder(args, build) / "plan.json")
    plan.write(out)
    render_plan(plan)
    print(f"plan: {out}")
    return 0


def _check_plan_output(out: Path, force: bool) -> None:
    """``plan --output``: a file path; an existing file only when it is a plan this tool wrote, or with --force."""
    if out.is_dir():
        raise SpecError([Problem("--output", str(out), "is a folder", f"name a file, e.g. {out / 'plan.json'}",
                                 code="output_is_dir")])
    if out.exists() and not force:
        try:
            ours = {"build", "target", "memory"} <= set(json.loads(out.read_text()))
        except (OSError, ValueError, TypeError):
            ours = False
        if not ours:
            raise SpecError([Problem("--output", str(out), "exists and is not a plan.json written by trtpipe",
                                     "pass --force to replace it, or another --output", code="output_exists")])


def _plan_inputs(args):
    """(build, target, hf_config) as ``plan`` reads them: --hf-config, model.hf_config while the weights are
    absent, else the model's own config.json; the spec-only rules checked first."""
    from builders import preflight
    from builders.hub import is_hub_source
    from builders.model_fetch import local_hf_config, resolve_source
    from builders.plan import read_hf_config
    from plugins.targets import get_target

    build = _resolve(args)
    target = get_target(build.target)
    stand_in = args.hf_config or (build.model.hf_config if not Path(build.model.source).exists() else None)
    hf_config = None
    if stand_in:
        if not Path(stand_in).is_file():
            raise SpecError([Problem("--hf-config" if args.hf_config else "model.hf_config", stand_in,
                                     "no such file", "point it at the model's config.json")], build.spec_path)
        hf_config = json.loads(Path(stand_in).read_text())
        hf_config.setdefault("_name_or_path", stand_in)
        print(f"planning with {stand_in} (model.source {build.model.source} is not read)")
    local = hf_config or local_hf_config(build.model.source, build.model.revision)  # a hub id: config.json alone
    preflight.check(build, target, local)
    if hf_config is None:
        hf_config = local if is_hub_source(build.model.source) else read_hf_config(resolve_source(build.model.source))
    from builders.prequant import source_quantization

    build, _ = source_quantization(build, hf_config)  # a pre-quantized source's recipe is what plan and tune see
    return build, target, hf_config


def cmd_tune(args) -> int:
    from builders import perf_model
    from pipeline import tune
    from pipeline.tune_view import render_tune
    from plugins.targets import get_target

    if args.gpus is not None and args.gpus < 1:  # 0 is not "the whole node": that is --gpus left out
        raise SpecError([tune.gpus_problem(args.gpus, get_target(args.target))])
    build, target, hf_config = _plan_inputs(args)
    spec_path = Path(build.spec_path)
    gpus = args.gpus if args.gpus is not None else target.gpus_per_node
    slo = tune.Slo(isl=args.isl, osl=args.osl, ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    out = Path(args.output) if args.output else tune.default_output(spec_path, build.target)
    if out.exists() and not args.force:  # before the search: it takes seconds
        raise SpecError([Problem("--output", str(out), "exists", "pass --force to replace it, or another --output",
                                 code="output_exists")])
    try:
        with _progress(not args.no_progress, "tune") as step:
            result = tune.tune(spec_path, build, target, hf_config, slo, gpus=gpus,
                               max_ppl_delta_pct=args.max_ppl_delta_pct,
                               progress=lambda phase, done, total: step(done, total))
    except perf_model.PerfModelUnavailable as e:
        print(f"error: no prediction: {e}", file=sys.stderr)
        return 2
    default = None
    if args.compare_default:
        with _progress(not args.no_progress, "aiconfigurator default") as step:
            picks = tune.library_default(build, target, hf_config, slo, gpus)
        default = [(p, tune.judge_pick(spec_path, build, target, hf_config, slo, p, args.max_ppl_delta_pct,
                                       result.accuracy)) for p in picks]
    render_tune(build, result, default)
    if result.best is None:
        print(f"no candidate meets TTFT <= {slo.ttft_ms:g} ms and TPOT <= {slo.tpot_ms:g} ms (the closest are "
              "listed above with what each misses by); relax the targets, allow more --gpus or a larger "
              "--max-ppl-delta-pct", file=sys.stderr)
        return 1
    plan = tune.write_build_file(spec_path, out, build, target, hf_config, result, force=args.force)
    print(f"build file: {out} (plans cleanly: {plan.memory.kv.workload_concurrency} sequences of "
          f"{slo.isl}+{slo.osl} in flight; build it with: trtpipe build {out} --target {build.target})")
    return 0


def _predict(build, target, plan, hf_config, args):
    """The plan's predicted speed (builders.perf_model): TensorRT-LLM's, and vLLM's and SGLang's beside it with
    ``--compare-frameworks``; a progress line while aiconfigurator runs."""
    from builders import perf_model

    backends = perf_model.BACKENDS if getattr(args, "compare_frameworks", False) else ("trtllm",)
    if perf_model.refusal(build, target, hf_config):
        return perf_model.predict_plan(build, target, plan, hf_config, backends=backends)
    with _progress(not args.no_progress, "predicting with aiconfigurator") as step:
        return perf_model.predict_plan(build, target, plan, hf_config, progress=step, backends=backends)


@contextlib.contextmanager
def _progress(enabled: bool, what: str):
    """Yield step(done, total) that draws a transient rich progress bar on stderr (nothing when disabled)."""
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def step(done, total):
            bar.update(task, completed=done, total=total)
        yield step


def server_config(args, build):
    """The ServerConfig for ``serve``: the build's repository (or ``--model-repo``), its ports and launcher."""
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig

    out = _folder(args, build)
    sv = build.settings.serving
    repo = Path(args.model_repo) if getattr(args, "model_repo", None) else out / "model_repo"
    if not (repo / "tensorrt_llm" / "config.pbtxt").is_file():
        raise PipelineError(f"{repo} holds no model repository (tensorrt_llm/config.pbtxt missing): "
                            + ("pass a folder written by the model_repo stage, or a copy of one" if
                               getattr(args, "model_repo", None)
                               else f"run `{_same_build(args, 'build')}` first" + _not_built(out)))
    return ServerConfig(model_repository=repo, http_port=args.http_port or sv.http_port,
                        grpc_port=args.grpc_port or sv.grpc_port, metrics_port=args.metrics_port or sv.metrics_port,
                        address=args.address, log_file=repo.parent / "tritonserver.log", ready_timeout_s=args.timeout,
                        python_path=default_sys_path(), launcher=build.runtime.launcher, world_size=build.world_size,
                        extra_args=_triton_key_args(args))


def _triton_key_args(args) -> list[str]:
    """Triton's admin APIs behind $TRITON_ADMIN_KEY when it is set (model_repo.launch.triton_restricted_argv); a
    non-loopback ``--address`` without it, or without $TRTPIPE_API_KEY for the OpenAI frontend, is refused before
    anything starts (PipelineError naming the variable)."""
    import os

    from model_repo.launch import FRONTEND_API_KEY_ENV, TRITON_ADMIN_APIS, TRITON_ADMIN_KEY_ENV, triton_restricted_argv
    from pipeline.openai_security import BindRefused, check_bind, is_loopback, resolve_api_key

    key = os.environ.get(TRITON_ADMIN_KEY_ENV) or None
    if key is None and not is_loopback(args.address):
        raise PipelineError(f"--address {args.address}: Triton would take model loads, shared-memory registrations "
                            f"and trace/log settings from anyone who reaches it: set {TRITON_ADMIN_KEY_ENV} (e.g. "
                            f"`export {TRITON_ADMIN_KEY_ENV}=$(openssl rand -hex 32)`) to put its "
                            f"{', '.join(TRITON_ADMIN_APIS)} APIs behind it, or serve on 127.0.0.1")
    if not getattr(args, "no_openai", True):
        try:
            check_bind(args.address, resolve_api_key(None))
        except BindRefused as exc:
            raise PipelineError(f"{exc} (or pass --no-openai; {FRONTEND_API_KEY_ENV} is read by the frontend)") from None
    try:
        return triton_restricted_argv(key) if key else []
    except ValueError as exc:
        raise PipelineError(f"{TRITON_ADMIN_KEY_ENV}: {exc}") from None


EXIT_NOT_INSTALLED = 3
"""`serve --server trtllm-serve` where trtllm-serve is not installed: the build checked out, nothing was started."""


def _already_serving(args, state: Path, wanted: dict) -> bool:
    """Whether the server ``state`` (the build's server.json) records runs as ``wanted`` asks (server.json's
    entries: pipeline.server_state.request_differences): True, said, when it does (rerunning `make build-engine &&
    make serve && make query` must not fail on busy ports); False when none runs, after removing what a crashed
    one left (its frontend, stubs, engine worker, /dev/shm regions).

    Raises:
        ServerError: one runs, differently (another repository, ports or frontend): each difference, and how to
            serve this instead (stop that one first).
    """
    from pipeline.server_failures import ServerError
    from pipeline.server_state import request_differences, server_status, stop_from_state

    status = server_status(state)
    if status is None:
        return False
    program = status.get("server", "tritonserver")
    if status.get("unreadable"):  # nothing in it can be stopped or compared
        print(f"{state} is unreadable (not a server.json trtpipe wrote): replaced by this serve's")
        return False
    if not status["running"]:
        result = stop_from_state(state)  # the frontend, stubs and worker a dead server left; its server.json
        left = f"; removed what it left: {result['orphans_killed']} process(es)" if result else ""
        print(f"the recorded {program} (pid {status.get('pid')}) had exited (crashed or killed; its log: "
              f"{status.get('log')}){left}: starting a new one")
        return False
    where = f"gRPC {status['grpc']}" if "grpc" in status else f"HTTP {status.get('http')}"
    stop = _same_build(args, "stop")
    differs = request_differences(status, wanted)
    if differs:
        raise ServerError(f"a {program} of this build already runs (pid {status['pid']}, {where}, log "
                          f"{status.get('log')}), not as asked: " + "; ".join(differs) + f". Stop it first "
                          f"(`{stop}`), then run this serve again; nothing was started")
    print(f"already serving: {program} (pid {status['pid']}, {where}, log {status.get('log')}): `{stop}` first to "
          "restart it")
    return True


def cmd_serve(args) -> int:
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, TritonServer, check_ports
    from pipeline.server_state import write_state

    build = _resolve(args)
    if args.server == "trtllm-serve":
        return _serve_trtllm(args, build)
    cfg = server_config(args, build)
    state = _folder(args, build) / "server.json"
    launch = None if args.no_openai else frontend_launch(
        build, cfg, args.openai_port or build.settings.serving.openai_port, _folder(args, build) / "engine")
    wanted = {"server": "tritonserver", "model_repository": str(cfg.model_repository), "http": cfg.http_url,
              "grpc": cfg.grpc_url, "metrics_port": cfg.metrics_port, "openai": launch.url if launch else None}
    if _already_serving(args, state, wanted):
        return 0
    check_ports(cfg, launch)  # every port before anything starts (Triton takes tens of seconds to be READY)
    # both start at once (the frontend's imports overlap the models' loading), then each is waited for
    server = TritonServer(cfg).start(detach=args.detach, wait=False)
    frontend = None
    try:
        if launch is not None:
            launch.triton_pid = server.proc.pid  # it exits once this tritonserver has
            frontend = OpenAIFrontend(launch)
            frontend.start(detach=args.detach, wait=False)
        server.wait_ready()
        if frontend is not None:
            frontend.wait_ready()
    except BaseException:
        if frontend is not None:
            frontend.stop()
        server.stop()
        raise
    write_state(state, server, frontend)
    print(f"tritonserver ready on {cfg.address}: HTTP {cfg.http_port}, gRPC {cfg.grpc_port}, "
          f"metrics {cfg.metrics_port} (pid {server.proc.pid}, log {server.log_path})")
    if frontend is not None:
        print(f"OpenAI API on {frontend.launch.url}/v1 (model {build.name!r}; /health, /metrics; pid "
              f"{frontend.proc.pid}, log {frontend.log_path})")
    return _detach_or_wait(args, server, state, frontend)


def _serve_trtllm(args, build) -> int:
    """``serve --server trtllm-serve``: check the build, then run trtllm-serve, or say what would run where."""
    import shlex

    from pipeline.launch_config import trtllm_serve_config
    from pipeline.serve import TrtllmServe
    from pipeline.server_state import write_state

    extra = [f"{flag} = {v}" for flag, v in (("--grpc-port", args.grpc_port), ("--metrics-port", args.metrics_port))
             if v]
    if extra:
        raise PipelineError(f"{', '.join(extra)}: trtllm-serve has one listener, HTTP (OpenAI API and /health): pass "
                            "--http-port only, or serve with --server triton")
    out = _folder(args, build)
    cfg = trtllm_serve_config(build, out, address=args.address, http_port=args.http_port,
                              ready_timeout_s=args.timeout, model_repo=args.model_repo)
    if TrtllmServe.executable() is None:
        print(f"checked: {cfg.checkpoint}/config.json (the unified HF checkpoint) and {cfg.options_file} (LLM-API "
              "options TensorRT-LLM 1.2.1 and 1.4 accept)")
        print(f"on a GPU host with TensorRT-LLM {build.runtime.tensorrt_llm.first_text} or later and "
              f"{cfg.world_size} GPU(s), e.g. in {cfg.image} with {out} at the same path, this runs:\n")
        print(shlex.join(cfg.argv))
        compose = out / "deploy" / "docker-compose.trtllm-serve.yaml"
        if compose.is_file():
            print(f"\n(or {compose}, {compose.parent / 'k8s' / 'trtllm-serve'}/: the same command on 0.0.0.0 in that "
                  "image; see deploy/README.md)")
        else:  # a deploy/ written before these files existed
            deploy = f"trtpipe deploy {args.build} --target {build.target}{_variant_flags(args)}"
            print(f"\n(`{deploy}` writes {compose.name} and k8s/trtllm-serve/ into deploy/: the same command on "
                  "0.0.0.0 in that image)")
        print("error: trtllm-serve is not on PATH here (TensorRT-LLM is not installed): nothing was started; run the "
              "command above on a GPU host", file=sys.stderr)
        return EXIT_NOT_INSTALLED
    state = out / "server.json"
    if _already_serving(args, state, {"server": "trtllm-serve", "http": f"{cfg.address}:{cfg.http_port}",
                                      "command": cfg.argv}):
        return 0
    server = TrtllmServe(cfg).start(detach=args.detach)
    write_state(state, server)
    print(f"trtllm-serve ready on {cfg.address}:{cfg.http_port}: OpenAI API under /v1, health {cfg.health_url} "
          f"(pid {server.proc.pid}, log {server.log_path})")
    return _detach_or_wait(args, server, state)


def _variant_flags(args) -> str:
    """``--quant``/``--runtime`` as given, for a command line to print."""
    return "".join(f" --{k} {v}" for k, v in (("quant", args.quant), ("runtime", getattr(args, "runtime", None))) if v)


def _detach_or_wait(args, server, state: Path, frontend=None) -> int:
    """Return now (``--detach``), or wait until SIGTERM/SIGINT or the server's exit, then stop it (and the
    frontend beside it)."""
    if args.detach:
        stop = _same_build(args, "stop")
        print(f"stop it with `{stop}`" + (" (or `make stop`)" if stop == _same_build(argparse.Namespace(), "stop")
                                          else ""))
        return 0
    stopping = {"flag": False}

    def _term(signum, frame):
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    while not stopping["flag"] and server.proc.poll() is None:
        time.sleep(0.5)
    if getattr(server, "program", "") == "tritonserver" and server.proc.poll() is None:
        from trtpipe_runtime.lifeline import drain

        drain(server.proc.pid)  # requests in flight end with why, through the frontend too
    if frontend is not None:
        frontend.stop(10)
    server.stop()
    state.unlink(missing_ok=True)
    return 0 if stopping["flag"] else 1


def cmd_stop(args) -> int:
    from pipeline.server_state import stop_from_state

    build = _resolve(args)
    state = _folder(args, build) / "server.json"
    result = stop_from_state(state)
    if result is None:
        print(f"no running server recorded in {state} (a server of another build file is stopped with `trtpipe stop "
              "BUILD.yaml [--target T]`, `make stop BUILD=BUILD.yaml`; one started with another output root with "
              "--out DIR, or from the folder it was started in)")
    elif result.get("crashed"):
        print(f"the recorded {result.get('server')} had already exited (crashed or killed; see its log); removed "
              f"what it left: {result['orphans_killed']} process(es), {result['shm_removed']} /dev/shm region(s)")
    elif result.get("server") == "trtllm-serve":
        print("stopped trtllm-serve" + (f", forcibly: it outlived SIGTERM or left child processes ("
                                        f"{result['stubs_killed']} killed)" if result["forced"] else ""))
    elif result["forced"]:
        print(f"stopped, forcibly: tritonserver did not finish its in-flight requests within its exit timeout "
              f"(e.g. a cancelled ensemble request still generating); {result['stubs_killed']} leftover "
              "Python-backend stub(s) killed")
    elif result.get("wait_s", 0) > 25:
        print(f"stopped after {result['wait_s']:.0f} s: tritonserver waited out its exit timeout (30 s) because a "
              "model did not unload (its log says 'failed to stop server')")
    else:
        print("stopped")
    return 0


def cmd_status(args) -> int:
    """``trtpipe status``: whether the build's recorded server runs (exit 0) or not (1: none recorded, or it has
    exited, with what it left running)."""
    from pipeline.server_state import server_status

    build = _resolve(args)
    state = _folder(args, build) / "server.json"
    status = server_status(state)
    if status is None:
        print(f"not serving: no server recorded in {state}")
        return 1
    program = status.get("server", "tritonserver")
    if status.get("unreadable"):
        print(f"not serving: {state} is unreadable (not a server.json trtpipe wrote)")
        return 1
    if not status["running"]:
        left = status["left"] + ([status["openai"]["pid"]] if status["openai_running"] else [])
        print(f"not serving: the recorded {program} (pid {status.get('pid')}) has exited (crashed or killed; its "
              f"log: {status.get('log')})" + (f"; still running from it: pid(s) {left}" if left else "")
              + f". `{_same_build(args, 'serve')}` starts a new one (and removes what is left), "
              f"`{_same_build(args, 'stop')}` removes what is left")
        return 1
    where = f"HTTP {status.get('http')}" + (f", gRPC {status['grpc']}" if "grpc" in status else "")
    print(f"serving: {program} (pid {status['pid']}, {where}, log {status.get('log')})")
    if status.get("model_repository"):
        print(f"  model repository: {status['model_repository']}")
    if status.get("openai"):
        state_word = "running" if status["openai_running"] else "exited"
        print(f"  OpenAI frontend: {status['openai'].get('url')} (pid {status['openai'].get('pid')}, {state_word}, "
              f"log {status['openai'].get('log')})")
    return 0


def query_url(url: str | None, build, out: Path) -> str:
    """Where ``query`` sends: ``--url``, else the gRPC address in the build's server.json while the server it
    records runs (``serve --grpc-port`` or a port chosen at start), else serving.grpc_port on 127.0.0.1."""
    from pipeline.server_state import running_from_state

    if url:
        return url
    state = running_from_state(out / "server.json") or {}
    grpc = state.get("grpc")
    return grpc.split("://", 1)[-1] if grpc else f"127.0.0.1:{build.settings.serving.grpc_port}"


def _query_constraint(args):
    """The --json-schema / --regex constraint of a query, read and checked before anything else (None without)."""
    from pipeline.structured import regex_constraint, schema_file

    if args.json_schema is not None:
        return schema_file(args.json_schema)
    if args.regex is not None:
        return regex_constraint(args.regex)
    return None


def cmd_query(args) -> int:
    from pipeline.client import format_chat, stream_generate

    constraint = _query_constraint(args)  # a bad schema file is named before the build is even resolved
    build = _resolve(args)
    out = _folder(args, build)
    url = query_url(args.url, build, out)
    if not args.raw and not (out / "engine" / "engine.json").is_file():
        raise PipelineError(f"{out / 'engine'} is not built yet: run `{_same_build(args, 'build')}` first, "
                            "or pass --raw to send the prompt without the model's chat template" + _not_built(out))
    extra = dict(constraint.triton_inputs()) if constraint else {}
    task = _query_task_id(build, out, args.model)
    if task:
        extra["lora_task_id"] = task
    text = args.prompt if args.raw else format_chat(out / "engine", args.prompt, args.system,
                                                    trust_remote_code=build.model.trust_remote_code)
    t0 = time.perf_counter()
    first, tokens, answer = None, 0, []
    for chunk in stream_generate(url, text, args.max_tokens, extra=extra or None):
        if chunk.num_tokens and first is None:
            first = chunk.t - t0
        tokens += chunk.num_tokens
        answer.append(chunk.text)
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    total = time.perf_counter() - t0
    sys.stdout.write("\n")
    print(f"[{tokens} tokens, TTFT {first if first is not None else float('nan'):.3f} s, total {total:.2f} s]",
          file=sys.stderr)
    return _report_constraint(constraint, "".join(answer), tokens, args.max_tokens) if constraint else 0


def _query_task_id(build, folder: Path, model: str | None) -> int:
    """``trtpipe query --model``: 0 for the base model (None, or the build's name), else the adapter's lora_task_id
    from ``folder``'s plan.json; PipelineError naming the served ones for another name."""
    if model is None or model == build.name:
        return 0
    from model_repo.deploy import served_adapters

    adapters = {a["name"]: int(a["task_id"]) for a in served_adapters(build, folder)}
    if model not in adapters:
        raise PipelineError(f"--model {model}: neither the base model ({build.name}) nor one of its LoRA adapters "
                            f"({', '.join(adapters) or 'the build file has no lora.adapters'}) of {build.spec_path}: "
                            "name a served one, or the build file that lists it (`--build FILE`; make: BUILD=FILE)")
    return adapters[model]


def _report_constraint(constraint, answer: str, tokens: int, max_tokens: int) -> int:
    """One stderr line: does the answer satisfy the constraint? Exit status 0 when it does, 1 when not."""
    from pipeline.structured import CAUSES, check_answer, jsonschema_module

    verdict = check_answer(constraint, answer, cut=tokens >= max_tokens)
    if constraint.kind == "json_schema":
        what = (f"validates against {constraint.source} (jsonschema)" if jsonschema_module() is not None
                else "parses as JSON (jsonschema not installed: not validated against the schema)")
    else:
        what = f"matches {constraint.guide!r} (Python's re.fullmatch)"
    if verdict.valid:
        print(f"[the answer {what}]", file=sys.stderr)
        return 0
    hint = f": raise --max-tokens (now {max_tokens})" if verdict.cause == "cut_by_max_tokens" else ""
    detail = f" ({verdict.detail})" if verdict.detail and not hint else ""
    print(f"[the answer does NOT satisfy the constraint: {verdict.cause}: {CAUSES[verdict.cause]}{detail}{hint}]",
          file=sys.stderr)
    return 1


def cmd_schema(args) -> int:
    from builders.spec import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_families(args) -> int:
    from plugins.architectures import support_markdown

    table = support_markdown()
    if args.write_docs:
        doc = Path(args.write_docs)
        text = doc.read_text()
        begin, end = "<!-- families:begin -->", "<!-- families:end -->"
        if begin not in text or end not in text:
            raise SpecError([Problem("--write-docs", str(doc), f"has no {begin} ... {end} block",
                                     "add the two marker lines where the table goes")])
        head, rest = text.split(begin, 1)
        doc.write_text(head + begin + "\n" + table + end + rest.split(end, 1)[1])
        print(f"wrote the family table into {doc}")
    else:
        sys.stdout.write(table)
    return 0


def cmd_fetch(args) -> int:
    from builders.hub import is_hub_source
    from builders.model_fetch import resolve_source

    if args.revision is not None and not is_hub_source(args.source):
        raise SpecError([Problem("--revision", args.revision, f"is for Hugging Face Hub sources only, and "
                                 f"{args.source!r} is not one", "leave --revision out, or name a hub id <org>/<name>",
                                 code="revision_not_hub")])
    print(resolve_source(args.source, args.revision))
    return 0


def cmd_cache(args) -> int:
    from pipeline import cache

    from builders.layout import build_root

    root = args.out or build_root()
    if args.cache_command == "list":
        rows = cache.entries(root)
        if not rows:
            print(f"no cached stages under {root}")
            return 0
        print(f"{'build':<20}{'target':<12}{'stage':<24}{'key':<22}{'age d':>7}{'MiB':>9}")
        for e in rows:
            print(f"{e.build:<20}{e.target:<12}{e.stage:<24}{e.state:<22}"
                  f"{e.age_days:>7.1f}{e.size_bytes / 2**20:>9.1f}")
        print(f"total {sum(e.size_bytes for e in rows) / 2**20:.1f} MiB in {len(rows)} folders under {root}")
        return 0
    result = cache.clean(root, older_than_days=args.older_than, build=args.build_name, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in result.removed:
        print(f"{verb} {e.path} ({e.size_bytes / 2**20:.1f} MiB)")
    for busy in result.busy:
        print(f"left {busy.folder} as it is: a running build (pid {busy.pid if busy.pid is not None else '?'}) is "
              f"using it; clean it again when that build ends")
    print(f"{verb} {len(result.removed)} folders, {sum(e.size_bytes for e in result.removed) / 2**20:.1f} MiB"
          + (f"; {len(result.busy)} in use left alone" if result.busy else ""))
    return 0


def _positive(text: str) -> int:
    """argparse type: an integer >= 1 (token counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1 (tokens)")
    return value


def _run_cli(argv: list[str]) -> int:
    """Another trtpipe command in this process (``eval --serve`` starts and stops servers with serve and stop)."""
    args = make_parser().parse_args(argv)
    return args.func(args)


def _variant_argv(args) -> list[str]:
    """``--quant``, ``--runtime`` and ``--out`` of ``args`` where given, as command-line arguments."""
    return [a for flag in ("quant", "runtime", "out") if getattr(args, flag, None)
            for a in (f"--{flag}", str(getattr(args, flag)))]


def _build_argv(args) -> list[str]:
    """The build file, target and variant flags of ``args`` as a command line's arguments."""
    return [str(args.build), "--target", args.target, *_variant_argv(args)]


def cmd_eval(args) -> int:
    """``trtpipe eval``: pipeline.evaluate.run_eval on each build's served endpoint (or --url), beside its source
    model; exit 1 when a build fails ``gates.max_task_drop_pct``."""
    from pipeline.evaluate import (EvalError, default_url, record_in_manifest, run_eval, side_by_side,
                                   source_model, table)

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise EvalError("--tasks names no task: pass e.g. --tasks trtpipe_lastword,trtpipe_cloze", "unknown_task")
    quants = [q.strip() for q in args.quant.split(",") if q.strip()] if args.quant else [None]
    variants = [(b, q) for b in (args.builds or [DEFAULT_BUILD]) for q in quants]
    urls = args.url or []
    if urls and len(urls) != len(variants):
        raise EvalError(f"{len(urls)} --url for {len(variants)} builds: give one --url per build, in the builds' "
                        "order, or none (each build is evaluated on its own `trtpipe serve`; --serve starts each "
                        "in turn)", "no_server")
    reports, failed = [], []
    for i, (path, quant) in enumerate(variants):
        one = argparse.Namespace(**{**vars(args), "build": path, "quant": quant, "url": urls[i] if urls else None})
        build = _resolve(one)
        out = _folder(one, build)
        source = None if args.no_source else source_model(build, out, args.source)  # before any server starts
        started = False
        if one.url:
            url = one.url
        else:
            try:
                url = default_url(out / "server.json", _same_build(one, "serve"))
            except EvalError:
                if not args.serve:
                    raise
                print(f"starting {out.parent.name}/{out.name}'s server for this evaluation (--serve)")
                if _run_cli(["serve", *_build_argv(one), "--detach"]) != 0:
                    raise EvalError(f"`{_same_build(one, 'serve')} --detach` failed: see its output above",
                                    "no_server") from None
                started = True
                url = default_url(out / "server.json", _same_build(one, "serve"))
        engine = out / "engine"
        tokenizer = engine if (engine / "tokenizer_config.json").is_file() else None
        label = f"{out.parent.name}/{out.name} ({build.settings.quantization.quant_algo or build.settings.dtype})"
        try:
            run_dir, report = run_eval(out=out, tasks=tasks, url=url, tokenizer=tokenizer, model=args.model,
                                       include=args.include_path, limit=args.limit,
                                       num_concurrent=args.num_concurrent, max_retries=args.max_retries,
                                       offline=args.offline, source=source,
                                       max_task_drop_pct=build.settings.gates.max_task_drop_pct, label=label)
        finally:
            if started:
                _run_cli(["stop", *_build_argv(one)])
        record_in_manifest(out / "manifest.json", run_dir, report)  # with the URL it scored
        src = report["source"]
        print(f"\nlm-eval {report['lm_eval_version']} on {label} at {report['url']} ({report['wall_s']:.1f} s)"
              + ("" if src is None else f"; source {src['label']} in-process"
                 + (" (reused: scored before)" if src["reused"] else "")))
        print(table(report))
        print(f"report: {run_dir / 'report.json'}")
        reports.append(report)
        if report["gate"]["passed"] is False:
            failed.append(label)
    if len(reports) > 1:
        print("\n" + side_by_side(reports))
    if failed:
        print(f"error: gates.max_task_drop_pct failed for {', '.join(failed)} (see the tables above)", file=sys.stderr)
        return 1
    return 0


def _positive_float(text: str) -> float:
    """argparse type: a number > 0 (milliseconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be > 0 (ms)")
    return value


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trtpipe",
        description="Build-and-deploy pipeline for LLMs: a build YAML -> ModelOpt-quantized TensorRT-LLM checkpoint "
                    "-> engine -> Triton model repository -> served and queried.",
        epilog="Typical flow: trtpipe build; trtpipe serve --detach; trtpipe query 'What is the capital of France?'")
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = sub.add_parser("build", help="run every stage: quantize -> checkpoint -> engine -> model repository",
                       description="Resolve the spec for a target, check it, then quantize with ModelOpt, export "
                                   "the TensorRT-LLM checkpoint, build the engine and write the Triton repository. "
                                   "Stages whose inputs did not change are reused.")
    _add_build_args(b)
    _add_run_flags(b)
    b.set_defaults(func=cmd_build)

    v = sub.add_parser("verify", help="quantize (if needed) and score the checkpoint against the source model",
                       description="Build the checkpoint stage, read its rank shards back into the source "
                                   "architecture and compare it with the source on held-out text: perplexity, "
                                   "top-1 agreement, KL, max logit error. Fails (exit 2) when a `gates:` "
                                   "threshold is exceeded.")
    _add_build_args(v)
    _add_run_flags(v)
    v.set_defaults(func=cmd_verify)

    pl = sub.add_parser("plan", help="check every rule for a target and print the memory/capability plan",
                        description="Check the spec, the target and the model's config.json (no weights) against "
                                    "every pre-flight rule, then print the plan (per-rank weights, activations, KV "
                                    "pool, plugins, warnings) and write plan.json into the build folder.")
    _add_build_args(pl)
    pl.add_argument("--isl", type=_positive, default=128, help="workload input length in tokens (default 128)")
    pl.add_argument("--osl", type=_positive, default=128, help="workload output length in tokens (default 128)")
    pl.add_argument("--output", type=Path, default=None, help="write plan.json here (default: "
                                                              "build/<name>/<target>/plan.json)")
    pl.add_argument("--hf-config", default=None, help="plan against this HF config.json instead of fetching "
                    "model.source (default: the build file's model.hf_config while model.source is absent)")
    pl.add_argument("--no-progress", action="store_true", help="no progress bar")
    pl.add_argument("--force", action="store_true", help="replace --output even when it is not a plan.json")
    pl.add_argument("--no-predict", action="store_true", help="skip the predicted TTFT/TPOT/throughput "
                    "(NVIDIA aiconfigurator, or a first-principles roofline estimate on GPUs it has no database for; "
                    "runtimes trtllm and trtllm-llmapi)")
    pl.add_argument("--compare-frameworks", action="store_true", help="also predict vLLM and SGLang on the same "
                    "GPUs (each loads its own database: a few seconds more the first time)")
    pl.set_defaults(func=cmd_plan)

    tn = sub.add_parser("tune", help="pick the settings with the most predicted goodput per GPU under a TTFT/TPOT "
                                     "target and write them as a build file",
                        description="Search quantization recipe x KV dtype x tp x pp (x ep) x max_batch_size x "
                                    "max_num_tokens x KV memory fraction; drop what the pre-flight rules, the memory "
                                    "plan or the accuracy limit refuse; rank the rest by goodput per GPU predicted "
                                    "by NVIDIA aiconfigurator (a prediction from its measured-kernel database, not "
                                    "a measurement); print the Pareto table and write the choice as a build file. "
                                    "Exit 1 when no candidate meets the targets (the closest are listed).")
    _add_build_args(tn)
    tn.add_argument("--isl", type=_positive, required=True, help="input length in tokens")
    tn.add_argument("--osl", type=_positive, required=True, help="output length in tokens")
    tn.add_argument("--ttft-ms", type=_positive_float, required=True, help="time-to-first-token target in ms")
    tn.add_argument("--tpot-ms", type=_positive_float, required=True, help="time-per-output-token target in ms")
    tn.add_argument("--gpus", type=int, default=None, help="GPUs one instance may use, at least 1 (default: the "
                                                          "target's gpus_per_node)")
    tn.add_argument("--max-ppl-delta-pct", type=float, default=5.0,
                    help="drop recipes whose measured perplexity delta exceeds this (default 5; from verify.json "
                         "of a build of this file, else the recorded quantization table)")
    tn.add_argument("--output", default=None, help="build file to write (default: <build file>.tuned-<target>.yaml "
                                                   "beside the build file)")
    tn.add_argument("--force", action="store_true", help="replace --output if it exists")
    tn.add_argument("--hf-config", default=None, help="the model's config.json (as for plan)")
    tn.add_argument("--compare-default", action="store_true", help="also run aiconfigurator's own default search "
                                                                   "for the same inputs and compare (~20 s)")
    tn.add_argument("--no-progress", action="store_true", help="no progress bar")
    tn.set_defaults(func=cmd_tune)

    d = sub.add_parser("deploy", help="(re)write or print the docker compose / Kubernetes files of a built build",
                       description="Write build/<name>/<target>/deploy/ (docker-compose.yaml, k8s/*.yaml) for a build "
                                   "that exists: the files `trtpipe build` writes, regenerated (e.g. after "
                                   "copying the build). --print shows them without writing anything.")
    _add_build_args(d)
    d.add_argument("--print", action="store_true", help="print the files to stdout instead of writing them")
    d.add_argument("--force", action="store_true", help="rewrite even when up to date")
    dy = d.add_argument_group("NVIDIA Dynamo (--engine dynamo: build/<name>/<target>/dynamo/{agg,disagg}/, from the "
                              "spec and its plan; the build need not exist yet)")
    dy.add_argument("--engine", choices=("triton", "dynamo"), default="triton",
                    help="triton: Triton on one node (default); dynamo: a DynamoGraphDeployment for Dynamo's operator")
    dy.add_argument("--disagg", action="store_true", help="separate prefill and decode workers (KV moved between them)")
    dy.add_argument("--router-mode", default="kv", help="the frontend's router: kv (KV-aware, default), round-robin, "
                                                       "random, ...")
    dy.add_argument("--kv-transfer", default="NIXL", help="KV transfer backend of disaggregated workers: NIXL "
                                                          "(default), UCX, MPI or DEFAULT")
    dy.add_argument("--replicas", type=int, default=1, help="worker replicas (aggregated)")
    for role in ("prefill", "decode"):
        dy.add_argument(f"--{role}-tp", type=int, default=None, help=f"tp_size of {role} workers (default: the build's)")
        dy.add_argument(f"--{role}-pp", type=int, default=None, help=f"pp_size of {role} workers (default: the build's)")
        dy.add_argument(f"--{role}-replicas", type=int, default=1, help=f"{role} worker replicas (default 1)")
    dy.add_argument("--namespace", default=None, help="Kubernetes namespace in the metadata (default: none: kubectl's)")
    dy.add_argument("--hf-config", default=None, help="the model's config.json (as for plan)")
    d.set_defaults(func=cmd_deploy)

    for name, func, helptext in (("serve", cmd_serve, "start tritonserver (or trtllm-serve) on the build and wait "
                                                      "until it is ready"),
                                 ("stop", cmd_stop, "stop a server started with serve --detach"),
                                 ("status", cmd_status, "say whether the build's server runs (exit 0) or not (1), "
                                                        "and what a crashed one left running")):
        sp = sub.add_parser(name, help=helptext)
        _add_build_args(sp)
        if name == "serve":
            sp.add_argument("--detach", action="store_true", help="return once READY, leaving the server running")
            sp.add_argument("--address", default="127.0.0.1", help="listen address (default 127.0.0.1)")
            sp.add_argument("--http-port", type=int, default=None, help="default: serving.http_port")
            sp.add_argument("--grpc-port", type=int, default=None, help="default: serving.grpc_port")
            sp.add_argument("--metrics-port", type=int, default=None, help="default: serving.metrics_port")
            sp.add_argument("--server", choices=("triton", "trtllm-serve"), default="triton",
                            help="which server runs the build (trtllm-serve: trtllm-llmapi builds only)")
            sp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for READY (default 600)")
            sp.add_argument("--openai-port", type=int, default=None, help="the OpenAI-compatible frontend's port "
                            "(default: serving.openai_port)")
            sp.add_argument("--no-openai", action="store_true", help="start tritonserver only, without the OpenAI "
                            "frontend")
            sp.add_argument("--model-repo", type=Path, default=None, metavar="DIR",
                            help="serve this repository instead of the build's model_repo (e.g. an edited copy, "
                                 "with a tensorrt_llm parameter changed); ports and settings still come from "
                                 "the build, `trtpipe stop` stops it, and its log goes to tritonserver.log beside DIR")
        sp.set_defaults(func=func)

    q = sub.add_parser("query", help="stream an answer to a chat prompt through the ensemble (gRPC)")
    _add_build_args(q, positional=False)
    q.add_argument("prompt", help="the user message")
    q.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    q.add_argument("--system", default=None, help="optional system message")
    q.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    q.add_argument("--url", default=None, help="gRPC host:port (default: the running server's, as trtpipe serve "
                                                "recorded it, else 127.0.0.1:<serving.grpc_port>)")
    q.add_argument("--model", default=None, metavar="NAME",
                   help="a LoRA adapter of the build file's lora.adapters (its lora_task_id, from the build's "
                        "plan.json, goes with the request), or the build's name for the base model (the default)")
    qg = q.add_argument_group("structured output (guided decoding: the ensemble's guided_decoding_guide_type / "
                              "_guide inputs); exit status 1 when the answer does not satisfy it")
    qx = qg.add_mutually_exclusive_group()
    qx.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                    help="constrain the answer to this JSON Schema (a JSON file); the answer is checked against it "
                         "with jsonschema when installed")
    qx.add_argument("--regex", default=None, metavar="PATTERN",
                    help="constrain the answer to this regular expression (checked with Python's re.fullmatch)")
    q.set_defaults(func=cmd_query)

    ev = sub.add_parser("eval", help="score served builds with lm-evaluation-harness tasks (mmlu, gsm8k, ... or the "
                                     "shipped trtpipe_lastword, trtpipe_cloze) beside the source model",
                        description="Run lm-evaluation-harness (pinned, .lmeval/) against each build's OpenAI endpoint "
                                    "(its `trtpipe serve` frontend, or --url): local-completions for log-likelihood "
                                    "tasks, local-chat-completions with the chat template for generate_until ones; "
                                    "and the same tasks on the source model in-process (lm-eval's hf model, reused "
                                    "across builds of one source). Prints per task both scores with standard "
                                    "errors, the difference with its 95% interval and the drop in percent; fails "
                                    "(exit 1) where it exceeds gates.max_task_drop_pct. Writes report.json and "
                                    "report.md to build/<name>/<target>/eval/<timestamp>/ and a summary to the "
                                    "manifest's `evaluations`; nothing else of the build changes. Several builds "
                                    "(or --quant a,b,c) are printed side by side.",
                        epilog="Offline, no download: trtpipe eval --tasks trtpipe_lastword,trtpipe_cloze. On a GPU "
                               "host with network: trtpipe eval my.yaml --target h100 --tasks mmlu,gsm8k "
                               "--num-concurrent 16.")
    ev.add_argument("builds", nargs="*", metavar="BUILD", help=f"build YAML file(s) (default: {DEFAULT_BUILD})")
    ev.add_argument("--target", default="cpu", help="target name: a key of `targets` in the build file and a "
                                                    "profile in configs/targets/ (default: cpu)")
    ev.add_argument("--quant", default=None, help="quantization.quant_algo override(s), comma-separated: the "
                                                  "build/<name>/<target>-<quant>/ variants, evaluated in turn")
    ev.add_argument("--runtime", default=None, help="runtime override (pytorch, trtllm, trtllm-llmapi), as built")
    ev.add_argument("--out", type=Path, default=None, help="output root (default: build/)")
    ev.add_argument("--tasks", required=True, help="comma-separated lm-eval task, group or tag names "
                    f"({', '.join(('trtpipe_lastword', 'trtpipe_cloze', 'trtpipe_mc', 'trtpipe_gen'))} ship with "
                    "trtpipe and need no download)")
    ev.add_argument("--url", action="append", default=None, help="an OpenAI-compatible server, http://HOST:PORT "
                    "(default: the OpenAI frontend `trtpipe serve` started for the build); once per build, in order")
    ev.add_argument("--serve", action="store_true", help="start each build's server that is not running (`trtpipe "
                                                         "serve --detach`) and stop it after its evaluation")
    ev.add_argument("--model", default=None, help="the model name sent (default: the first /v1/models lists)")
    ev.add_argument("--source", default=None, metavar="DIR", help="the HF checkpoint folder to compare with "
                    "(default: the build's source model; model.reference for a pre-quantized source)")
    ev.add_argument("--no-source", action="store_true", help="score the build alone (no comparison, no gate)")
    ev.add_argument("--limit", type=float, default=None, help="lm-eval's --limit: at most N items per task "
                                                              "(a fraction when < 1)")
    ev.add_argument("--num-concurrent", type=_positive, default=1, help="requests in flight (lm-eval's "
                                                                        "num_concurrent; default 1)")
    ev.add_argument("--max-retries", type=int, default=3, help="lm-eval's max_retries per request (default 3)")
    ev.add_argument("--include-path", type=Path, action="append", default=[], metavar="DIR",
                    help="a folder of extra lm-eval task YAMLs (repeatable)")
    ev.add_argument("--offline", action="store_true", help="no downloads (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): "
                                                           "datasets must be cached or local")
    ev.set_defaults(func=cmd_eval)

    s = sub.add_parser("schema", help="print the JSON Schema of build files (for editor completion)")
    s.add_argument("-o", "--output", default=None, help="write to this file instead of stdout")
    s.set_defaults(func=cmd_schema)

    f = sub.add_parser("families", help="which model families each runtime builds, with which quantizations "
                                        "(markdown)",
                       description="Print the table of model families (HF architectures[0]) x runtimes: each cell "
                                   "lists the quant_algo values that runtime builds the family with ('all': every "
                                   "one) and the checkpoint format it writes, or why it refuses (numbered reasons "
                                   "below the table). From plugins/architectures.py.")
    f.add_argument("--write-docs", default=None, metavar="MD", help="replace the table between the families "
                   "markers of this file (docs/writing-a-build-file.md)")
    f.set_defaults(func=cmd_families)

    c = sub.add_parser("cache", help="list or clean cached stage outputs under build/")
    csub = c.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    cl = csub.add_parser("list", help="every finished stage folder with its key, age and size")
    cc = csub.add_parser("clean", help="delete stage folders (and folders left by interrupted builds)")
    cc.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="only folders older than DAYS")
    cc.add_argument("--build", dest="build_name", default=None, metavar="NAME", help="only this build name")
    cc.add_argument("--dry-run", action="store_true", help="print what would be removed")
    for sp in (cl, cc):
        sp.add_argument("--out", type=Path, default=None, help="output root (default: build/)")
    c.set_defaults(func=cmd_cache)

    f = sub.add_parser("fetch", help="resolve a model source (embedded:<name>, a folder, or a Hugging Face Hub id "
                       "<org>/<name>) to an HF folder and print its path; a hub id is downloaded into huggingface_hub's "
                       "cache (HF_HOME / HF_HUB_CACHE; HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE apply)")
    f.add_argument("source", nargs="?", default="embedded:smollm2-135m-instruct",
                   help="embedded:<name>, a checkpoint folder, or <org>/<name> on the hub (a folder of that name wins)")
    f.add_argument("--revision", default=None, help="a hub id's branch, tag or commit (default: main)")
    f.set_defaults(func=cmd_fetch)

    from pipeline.loadtest.cli import add_loadtest_parser

    add_loadtest_parser(sub, _add_build_args)
    _describe(p)
    return p


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so that `trtpipe VERB --help` says
    what the verb does (argparse shows ``help`` only in the parent's list)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sp in action.choices.items():
                if sp.description is None and helps.get(name):
                    sp.description = helps[name][0].upper() + helps[name][1:] + "."
                _describe(sp)


def main(argv: list[str] | None = None) -> int:
    passive_openmp()  # this process and every one it starts (build stages, tritonserver, workers)
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="[trtpipe] %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "urllib3", "filelock"):  # httpx2: huggingface_hub 2.4's client
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return args.func(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full or read-only disk outside the build's own reporting: where and what to do
        from plugins.fsutil import write_failure

        err = write_failure(exc, Path(exc.filename or "."), "trtpipe")
        if err is None:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
