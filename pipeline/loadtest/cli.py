"""``trtpipe loadtest run | compare | selfcheck``: argument parsing and printing only."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

from builders.spec import default_port
from plugins.errors import PipelineError

log = logging.getLogger("trtpipe")
EXIT_SLO_MISSED = 1
EXIT_INVALID = 3


def add_loadtest_parser(sub, add_build_args) -> None:
    """Register ``loadtest`` on the top-level subparsers (``add_build_args`` from pipeline.cli)."""
    lt = sub.add_parser("loadtest", help="load-test the served ensemble (gRPC streaming): run, compare, selfcheck",
                        description="Closed-loop (concurrency) or open-loop (request rate) load on the ensemble, "
                                    "with TTFT/TPOT/ITL/E2E, throughput, goodput against SLOs, reports and plots. "
                                    "Exit status: 0 ok, 1 SLO missed, 2 bad input, 3 a point was invalid "
                                    "(client-bound, server unreachable or overloaded).")
    lsub = lt.add_subparsers(dest="loadtest_command", required=True, metavar="ACTION")

    r = lsub.add_parser("run", help="run a load test (starts the server itself unless one is running or --url)")
    add_build_args(r)
    g = r.add_argument_group("server")
    g.add_argument("--url", default=None, help="gRPC host:port of a running server, or an OpenAI base URL with "
                   "--endpoint openai-* (default: the build's, "
                                               "started here on free ports when not running)")
    g.add_argument("--metrics-url", default=None, help="Triton metrics URL (http://host:port/metrics)")
    g.add_argument("--model-repo", type=Path, default=None, help="start a server on this repository instead")
    g.add_argument("--model", default="ensemble", help="model name (default ensemble; OpenAI endpoints: the "
                   "server's model)")
    g.add_argument("--models", default=None, metavar="A,B,...",
                   help="spread the requests round-robin over these models: the base model by its build name, LoRA "
                        "adapters by their names in the build file's lora.adapters; the report gives each model's "
                        "figures beside the totals (triton: each adapter's lora_task_id, from the build's plan.json; "
                        "OpenAI endpoints: sent as `model`)")
    g.add_argument("--endpoint", choices=("triton", "openai-chat", "openai-completions"), default="triton",
                   help="what to load: Triton's ensemble over gRPC (default), or an OpenAI-compatible server's "
                        f"/v1/chat/completions or /v1/completions (--url: its base URL, e.g. http://host:{default_port('openai_port')}/v1)")
    g = r.add_argument_group("load shape (one of --concurrency / --rate; comma lists sweep)")
    g.add_argument("--concurrency", default=None, help="closed loop: requests in flight, e.g. 1,2,4 (default 1)")
    g.add_argument("--rate", default=None, help="open loop: requests/s, e.g. 0.5,1,2")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals (1.0 = Poisson)")
    g.add_argument("--num-requests", type=int, default=32, help="measured requests per point (default 32)")
    g.add_argument("--duration", type=float, default=300.0, help="most seconds of sending per point (default 300)")
    g.add_argument("--warmup", type=int, default=2,
                   help="warm-up requests per point, not measured, sent in waves of the point's concurrency "
                        "(default 2); a full wave warms every batch shape the point will use")
    g.add_argument("--connections", type=int, default=1, help="gRPC streams per client process (default 1)")
    g.add_argument("--client-procs", type=int, default=1, help="client processes (default 1)")
    g.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request (default 300)")
    g = r.add_argument_group("workload")
    g.add_argument("--input-len", default="128", help="synthetic input tokens: N | uniform:LO:HI | normal:MEAN:STD")
    g.add_argument("--output-len", default="32", help="max_tokens: N | uniform:LO:HI | normal:MEAN:STD")
    g.add_argument("--shared-prefixes", type=int, default=0, help="N distinct shared prefixes (system prompts); "
                   "request i starts with prefix i mod N (prefix caching runs; default 0: none)")
    g.add_argument("--shared-prefix-len", type=int, default=800, help="tokens of each shared prefix "
                   "(default 800)")
    g.add_argument("--dataset", type=Path, default=None, help="JSONL of prompts ({\"prompt\": ..., "
                                                               "optional \"output_len\"}) instead of synthetic")
    g.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default: engine/ beside the "
                                                                "repository; with --url, the build's engine/)")
    g.add_argument("--fixed-output", choices=("none", "min_tokens"), default="none",
                   help="min_tokens: send min_tokens = max_tokens (needs the runtime's min_tokens)")
    g.add_argument("--ignore-eos", action="store_true", help="set end_id to an id never generated, so every "
                                                             "request runs to max_tokens")
    g.add_argument("--no-perf-metrics", action="store_true", help="do not ask for server-side timings")
    g.add_argument("--seed", type=int, default=0)
    g = r.add_argument_group("structured output (each answer is checked; the report counts the valid ones)")
    g.add_argument("--response-format", default=None, metavar="json_object|json_schema:FILE",
                   help="constrain every answer to a JSON object, or to the JSON Schema in FILE: OpenAI's "
                        "response_format on the OpenAI endpoints, the ensemble's guided-decoding inputs on triton; "
                        "answers are parsed (and validated with jsonschema when installed)")
    g.add_argument("--tools", type=Path, default=None, metavar="FILE",
                   help="openai-chat: send this OpenAI tools JSON list with every request; each answer's tool calls "
                        "are parsed and their arguments validated against the function's parameters")
    g.add_argument("--tool-choice", default=None, metavar="required|auto|NAME",
                   help="with --tools: required (some call, forced by a schema), auto (the model decides; OpenAI's "
                        "default, used when not given) or a function's NAME (that call, forced)")
    g.add_argument("--check-only", action="store_true",
                   help="check the answers against --response-format without sending it: the unconstrained "
                        "baseline of the same run, for `trtpipe loadtest compare`")
    g = r.add_argument_group("SLOs and validity")
    g.add_argument("--slo-ttft-ms", type=float, default=None)
    g.add_argument("--slo-tpot-ms", type=float, default=None)
    g.add_argument("--slo-e2e-ms", type=float, default=None)
    g.add_argument("--slo-attainment", type=float, default=0.9, help="fraction of requests that must meet every "
                                                                      "SLO (default 0.9)")
    g.add_argument("--max-schedule-lag-ms", type=float, default=50.0, help="p95 schedule lag above this marks a "
                                                                            "point client-bound (default 50)")
    g.add_argument("--ceiling", type=Path, default=None, help="selfcheck.json: points above its rate are invalid")
    g.add_argument("--allow-invalid", action="store_true", help="exit 0 even when a point was invalid")
    r.add_argument("-o", "--output", type=Path, default=None, help="report folder (default: "
                                                                   "<build>/loadtest/<UTC time>)")
    r.add_argument("--no-plots", action="store_true")
    r.set_defaults(func=cmd_run)

    c = lsub.add_parser("compare", help="compare two report.json files point by point")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.set_defaults(func=cmd_compare)

    s = lsub.add_parser("selfcheck", help="the client's own ceiling against a trivial streaming model")
    s.add_argument("--rates", default="25,50,100,200,400", help="open-loop rates to escalate through")
    s.add_argument("--output-len", type=int, default=16)
    s.add_argument("--seconds", type=float, default=3.0, help="seconds of load per rate")
    s.add_argument("--client-procs", type=int, default=1)
    s.add_argument("--connections", type=int, default=1)
    s.add_argument("-o", "--output", type=Path, default=Path("build/loadtest/selfcheck.json"))
    s.set_defaults(func=cmd_selfcheck)


def _config(args, url: str, metrics_url: str | None, tokenizer: Path | None):
    from pipeline.loadtest.config import LoadTestConfig
    from pipeline.loadtest.metrics import SLO
    from pipeline.loadtest.schedule import parse_sweep
    from pipeline.loadtest.selfcheck import load_ceiling

    if args.concurrency and args.rate:
        raise PipelineError("give --concurrency (closed loop) or --rate (open loop), not both")
    ms = lambda v: None if v is None else v / 1e3  # noqa: E731
    try:
        conc, rate = parse_sweep(args.concurrency, int), parse_sweep(args.rate, float)
    except ValueError as exc:
        raise PipelineError(f"--concurrency/--rate: comma-separated numbers expected ({exc})") from exc
    return LoadTestConfig(
        url=url, endpoint=args.endpoint, shared_prefixes=args.shared_prefixes,
        shared_prefix_len=args.shared_prefix_len, metrics_url=metrics_url, model=args.model,
        mode="open" if rate else "closed",
        concurrency=conc or [1], rate=rate or [1.0], burstiness=args.burstiness, num_requests=args.num_requests,
        duration_s=args.duration, warmup=args.warmup, input_len=args.input_len, output_len=args.output_len,
        dataset=args.dataset, tokenizer_dir=tokenizer,
        fixed_output="ignore_eos" if args.ignore_eos else args.fixed_output, perf_metrics=not args.no_perf_metrics,
        seed=args.seed, connections=args.connections, client_procs=args.client_procs,
        request_timeout_s=args.request_timeout, slo=SLO(ms(args.slo_ttft_ms), ms(args.slo_tpot_ms),
                                                       ms(args.slo_e2e_ms)),
        slo_attainment=args.slo_attainment, max_schedule_lag_s=args.max_schedule_lag_ms / 1e3,
        ceiling_rps=load_ceiling(args.ceiling) if args.ceiling else None,
        response_format=args.response_format, tools=args.tools, tool_choice=args.tool_choice,
        check_only=args.check_only, models=models_arg(args.models))


def cmd_run(args) -> int:
    from pipeline.loadtest.api import run_loadtest
    from pipeline.loadtest.report import format_summary, write_reports
    from pipeline.loadtest.selfcheck import serve_repository

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    if args.dataset is not None:  # every bad line reported before any server is started
        from pipeline.loadtest.workload import read_jsonl

        read_jsonl(args.dataset)
    from pipeline.loadtest.config import constraint_problems

    fixed = "ignore_eos" if args.ignore_eos else args.fixed_output
    problems = constraint_problems(args.endpoint, args.response_format, args.tools, args.tool_choice, fixed,
                                   args.check_only)
    if problems:  # the constraint's files read and checked before any server is started
        from pipeline.loadtest.api import LoadTestError

        raise LoadTestError("bad load-test arguments:\n  - " + "\n  - ".join(problems))
    with contextlib.ExitStack() as stack:
        repo, out_root, url, metrics_url = args.model_repo, None, args.url, args.metrics_url
        if url is None and repo is None:
            from builders.layout import build_dir, resolve_build, variant

            runtime = getattr(args, "runtime", None)
            out_root = build_dir(resolve_build(args.build, args.target, args.quant, runtime), args.out,
                                 variant(args.quant, runtime, args.build, args.target))
            repo = out_root / "model_repo"
            from pipeline.server_state import running_from_state

            info = running_from_state(out_root / "server.json")
            openai = args.endpoint != "triton"
            if info and openai:
                base = (info.get("openai") or {}).get("url") or (
                    f"http://{info['http']}" if info.get("server") == "trtllm-serve" else None)
                if base is None:
                    raise PipelineError(f"the server recorded in {out_root / 'server.json'} runs without the OpenAI "
                                        "frontend (serve --no-openai): restart it without that flag, or pass --url")
                url = base.rstrip("/") + ("" if base.rstrip("/").endswith("/v1") else "/v1")
                log.info("using the running OpenAI API recorded in %s (%s)", out_root / "server.json", url)
            elif info and "grpc" not in info:
                raise PipelineError(f"the server recorded in {out_root / 'server.json'} is {info.get('server')} "
                                    "(OpenAI API), not tritonserver: pass --endpoint openai-chat (or "
                                    "openai-completions) to load it, or `trtpipe stop` it and rerun")
            elif info:
                url, metrics_url = info["grpc"], metrics_url or f"http://127.0.0.1:{info['metrics_port']}/metrics"
                log.info("using the running server recorded in %s (%s)", out_root / "server.json", url)
        if repo is not None and not (Path(repo) / "ensemble" / "config.pbtxt").is_file() and url is None:
            raise PipelineError(f"{repo} is not a model repository (ensemble/config.pbtxt missing): run "
                                "`trtpipe build` first, or pass --url of a running server")
        if url is None:
            frontend = None
            if args.endpoint != "triton":  # a frontend beside the server, as `trtpipe serve` starts it
                from builders.layout import resolve_build

                frontend = resolve_build(args.build, args.target, args.quant, getattr(args, "runtime", None))
            url, metrics_url, *openai_url = stack.enter_context(serve_repository(Path(repo), frontend_for=frontend))
            if openai_url:
                url = openai_url[0]
        tokenizer = args.tokenizer or (Path(repo).parent / "engine" if repo is not None else _build_engine(args))
        cfg = _config(args, url, metrics_url, tokenizer)
        if cfg.models and cfg.endpoint == "triton":
            cfg.lora_task_ids = lora_task_ids(args, Path(repo).parent if repo is not None else None)
        manifest_path = Path(repo).parent / "manifest.json" if repo is not None else None
        manifest = json.loads(manifest_path.read_text()) if manifest_path and manifest_path.is_file() else None
        report = run_loadtest(cfg, manifest=manifest)
    out = args.output or ((out_root or Path("build")) / "loadtest" / stamp)
    paths = write_reports(report, out, plots=not args.no_plots)
    print(format_summary(report))
    print("\n".join(f"{k}: {v}" for k, v in paths.items()))
    v = report["verdict"]
    if v["slo_missed_points"]:
        print(f"SLO missed at points {v['slo_missed_points']} (attainment < {v['slo_attainment']})", file=sys.stderr)
        return EXIT_SLO_MISSED
    if v["invalid_points"] and not args.allow_invalid:
        print(f"points {v['invalid_points']} are invalid (reasons above): not a measurement of the server at the "
              "asked load; --allow-invalid exits 0 anyway", file=sys.stderr)
        return EXIT_INVALID
    return 0


def models_arg(text: str | None) -> list[str]:
    """``--models a,b,base`` -> the names (blanks dropped); [] when not given."""
    return [m.strip() for m in (text or "").split(",") if m.strip()]


def lora_task_ids(args, folder: Path | None = None) -> dict[str, int]:
    """Model name -> the lora_task_id the Triton endpoint sends for it: the build's name -> 0 (the base model, sent
    without one), each adapter of its plan.json ``lora.adapters`` -> its task id. ``folder``: the build folder
    (default: the build file's, as ``trtpipe build`` writes it)."""
    from builders.layout import build_dir, resolve_build, variant
    from model_repo.deploy import served_adapters

    runtime = getattr(args, "runtime", None)
    build = resolve_build(args.build, args.target, args.quant, runtime)
    folder = folder or build_dir(build, args.out, variant(args.quant, runtime, args.build, args.target))
    return {build.name: 0, **{a["name"]: int(a["task_id"]) for a in served_adapters(build, folder)}}


def _build_engine(args) -> Path | None:
    """``--url`` without ``--tokenizer``: the build's ``engine/`` folder (the tokenizer a server started here would
    use), or None (logged) when the build file does not resolve."""
    from builders.layout import build_dir, resolve_build, variant

    runtime = getattr(args, "runtime", None)
    try:
        return build_dir(resolve_build(args.build, args.target, args.quant, runtime), args.out,
                         variant(args.quant, runtime, args.build, args.target)) / "engine"
    except PipelineError as exc:
        log.warning("warning: no build to take the tokenizer from: %s", " ".join(str(exc).split()))
        return None


def cmd_compare(args) -> int:
    from pipeline.loadtest.report import compare, load

    print(compare(load(args.a), load(args.b)))
    return 0


def cmd_selfcheck(args) -> int:
    from pipeline.loadtest.schedule import parse_sweep
    from pipeline.loadtest.selfcheck import selfcheck

    result = selfcheck(parse_sweep(args.rates, float), output_len=args.output_len, seconds_per_rate=args.seconds,
                       client_procs=args.client_procs, connections=args.connections)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'rate':>8}{'achieved':>10}{'resp/s':>10}{'lag p95 ms':>12}{'client cpu':>12}  kept up")
    for r in result["rows"]:
        print(f"{r['rate']:>8g}{r['achieved_rps']:>10.1f}{r['responses_per_s'] or 0:>10.0f}"
              f"{(r['schedule_lag_p95_s'] or 0) * 1e3:>12.1f}{r['client_cpu']:>12.0%}  {r['kept_up']}")
    print(f"client ceiling: {result['ceiling_rps']} req/s (output {args.output_len} tokens) -> {args.output}")
    return 0
