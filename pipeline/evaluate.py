"""``trtpipe eval``: score a served build with lm-evaluation-harness (pinned 0.4.13, its own venv ``.lmeval/``,
its own task registry) through an OpenAI-compatible endpoint, by default the build's ``trtpipe serve`` frontend, beside
the source model scored in-process, and compare them.

lm-eval runs as its own process: ``local-completions`` (``<url>/v1/completions``) for the tasks whose requests are
log-likelihoods and ``local-chat-completions`` (``<url>/v1/chat/completions``, ``--apply_chat_template``) for
``generate_until`` tasks, decided per task from lm-eval's own task config (``output_type``, read by
pipeline/lm_eval_probe.py from lm_eval/tasks/_index.py's index); the source model runs the same split with lm-eval's
``hf`` model (:func:`score_source`, cached per source digest). The tokenizer is the build's ``engine/`` folder, so
lm-eval downloads nothing for the model. :func:`compare` gives each task metric's difference with a 95% interval and
its drop in percent; :func:`gate` applies ``gates.max_task_drop_pct``. Results go to
``build/<name>/<target>/eval/<timestamp>/`` (lm-eval's output under ``build/``, ``report.json``, ``report.md``) and a
summary to the manifest's ``evaluations`` (:func:`record_in_manifest`); nothing else of the build folder is written.

The project ships small tasks of its own (:data:`SHIPPED`, ``pipeline/eval_tasks/``) so that ``trtpipe eval`` works
offline: ``trtpipe_lastword`` and ``trtpipe_cloze`` from the held-out calibration text (scripts/make_eval_tasks.py),
``trtpipe_mc`` and ``trtpipe_gen`` written for this project.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from plugins.errors import PipelineError

TASKS_DIR = Path(__file__).parent / "eval_tasks"
"""The shipped task YAMLs and their JSONL items (package data)."""
SHIPPED = ("trtpipe_mc", "trtpipe_gen", "trtpipe_lastword", "trtpipe_cloze")
LOGLIKELIHOOD_TYPES = frozenset({"loglikelihood", "loglikelihood_rolling", "multiple_choice"})
"""lm-eval 0.4.13's output_type values answered with log-likelihoods (lm_eval/api/task.py ConfigurableTask
construct_requests): sent to ``local-completions`` (echo + logprobs); ``generate_until`` goes to chat."""
LM_EVAL_ENV = "TRTPIPE_LM_EVAL"


class EvalError(PipelineError):
    """``trtpipe eval`` cannot run or lm-eval failed: the message says why and what to do; ``code`` is stable
    (``no_lm_eval``, ``no_server``, ``unreachable``, ``unauthorized``, ``unknown_task``, ``missing_data``,
    ``dataset_offline``, ``no_tokenizer``, ``lm_eval_failed``)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def find_lm_eval() -> Path:
    """The lm_eval program: ``$TRTPIPE_LM_EVAL`` when set, else the checkout's ``.lmeval/bin/lm_eval``
    (scripts/setup.sh), else ``lm_eval`` on PATH; EvalError ``no_lm_eval`` naming ``make setup`` otherwise."""
    env = os.environ.get(LM_EVAL_ENV)
    if env:
        if not Path(env).is_file():
            raise EvalError(f"{LM_EVAL_ENV}={env} is not a file: point it at lm-evaluation-harness's lm_eval "
                            "program, or unset it", "no_lm_eval")
        return Path(env)
    local = Path(__file__).resolve().parents[1] / ".lmeval" / "bin" / "lm_eval"
    if local.is_file():
        return local
    found = shutil.which("lm_eval")
    if found:
        return Path(found)
    raise EvalError("lm-evaluation-harness is not installed: run `make setup` (it creates .lmeval/ with "
                    "lm-eval 0.4.13), or put lm_eval on PATH, or set TRTPIPE_LM_EVAL to its lm_eval program",
                    "no_lm_eval")


def lm_eval_python(lm_eval: Path) -> str:
    """The Python that runs ``lm_eval`` (its script's ``#!`` line; the venv's python beside it otherwise)."""
    with open(lm_eval, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    beside = lm_eval.parent / "python"
    return str(beside) if beside.exists() else sys.executable


def default_url(state_path: Path, again: str) -> str:
    """The OpenAI frontend URL recorded in the build's server.json (``trtpipe serve``) while it runs; EvalError
    ``no_server`` saying to run ``again`` (the serve command) or pass --url otherwise."""
    from pipeline.server_state import server_status

    if not (state_path.parent / "model_repo").is_dir() and not (state_path.parent / "bundle").is_dir():
        build = again.replace(" serve", " build", 1)
        raise EvalError(f"{state_path.parent} holds no built model to serve: build it first (`{build}`), then "
                        f"evaluate it (--serve starts its server), or pass --url of a running OpenAI-compatible "
                        "server", "no_server")
    status = server_status(state_path) or {}
    front = status.get("openai") or {}
    if status.get("running") and status.get("openai_running") and front.get("url"):
        return front["url"]
    if status.get("server") == "trtllm-serve" and status.get("running"):
        return "http://" + status["http"].split("://", 1)[-1]
    raise EvalError(f"no OpenAI frontend of this build runs (none recorded in {state_path}): start one with "
                    f"`{again} --detach`, or pass --url http://HOST:PORT of any OpenAI-compatible server",
                    "no_server")


def api_key() -> str | None:
    """The bearer token sent to the endpoint: ``$OPENAI_API_KEY`` (what lm-eval's API models send), else
    ``$TRTPIPE_API_KEY`` (what ``trtpipe serve``'s frontend checks)."""
    return os.environ.get("OPENAI_API_KEY") or os.environ.get("TRTPIPE_API_KEY") or None


def served_models(url: str, timeout: float = 10.0) -> list[str]:
    """The model ids ``<url>/v1/models`` lists; EvalError ``unreachable`` naming the URL and the fix."""
    target = url.rstrip("/") + "/v1/models"
    key = api_key()
    req = urllib.request.Request(target, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise EvalError(f"{target} answers {exc.code} {exc.reason}: the server wants an API key; set "
                            "TRTPIPE_API_KEY (or OPENAI_API_KEY) to the key it was started with"
                            + (" (the one set is refused)" if key else ""), "unauthorized") from None
        raise EvalError(f"{target} answers {exc.code} {exc.reason}: is this an OpenAI-compatible server? pass its "
                        "--url as http://HOST:PORT (without /v1)", "unreachable") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EvalError(f"{target} does not answer ({reason}): start the server (`trtpipe serve --detach`) or "
                        "pass the --url of a running OpenAI-compatible server (http://HOST:PORT, without /v1)",
                        "unreachable") from None
    return [m.get("id") for m in body.get("data", []) if isinstance(m, dict) and m.get("id")]


@dataclass
class TaskPlan:
    """What lm-eval's task index says about the asked tasks (pipeline/lm_eval_probe.py)."""

    version: str | None
    kinds: dict[str, list[str]]
    datasets: dict[str, dict] = field(default_factory=dict)


def probe_tasks(lm_eval: Path, tasks: list[str], include: list[Path]) -> TaskPlan:
    """Ask lm-eval's own task index (no dataset loaded) which output_types each task names; EvalError
    ``unknown_task`` naming every task it does not know."""
    probe = Path(__file__).with_name("lm_eval_probe.py")
    inc = os.pathsep.join(str(p) for p in include)
    p = subprocess.run([lm_eval_python(lm_eval), str(probe), inc, *tasks], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise EvalError(f"lm-eval's task index could not be read ({lm_eval}):\n{p.stderr[-2000:]}", "lm_eval_failed")
    out = json.loads(lines[-1])
    unknown = [t for t, k in out["tasks"].items() if k is None]
    if unknown:
        where = ", ".join(str(p) for p in include) or "none"
        raise EvalError(f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: lm-eval "
                        f"{out.get('version')} has no task, group or tag of that name (include paths: {where}); "
                        f"`{lm_eval} ls tasks` lists its own, trtpipe ships {', '.join(SHIPPED)}, and "
                        "--include-path DIR adds a folder of task YAMLs", "unknown_task")
    return TaskPlan(out.get("version"), out["tasks"], out.get("datasets") or {})


def model_kind(output_types: list[str]) -> str:
    """``local-completions`` when every output_type is a log-likelihood one, ``local-chat-completions`` when all
    are ``generate_until``, ``mixed`` otherwise (see :func:`_groups`)."""
    kinds = {"local-completions" if t in LOGLIKELIHOOD_TYPES else "local-chat-completions" for t in output_types}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def check_local_data(plan: TaskPlan, cwd: Path) -> None:
    """A task whose dataset is local files (``dataset_kwargs.data_files``, resolved by datasets against the
    working directory) that do not exist: EvalError ``missing_data`` naming the task and the files."""
    for task, ds in plan.datasets.items():
        missing = [f for f in ds.get("data_files", []) if not re.match(r"^[a-z]+://", f)
                   and not any(ch in f for ch in "*?[") and not (cwd / f).exists()]
        if missing:
            raise EvalError(f"task {task}: its data file{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)} (dataset_kwargs.data_files, relative to {cwd}) "
                            f"{'do' if len(missing) > 1 else 'does'} not exist: put the data there, or run from the "
                            "folder its paths are relative to", "missing_data")


def materialize_shipped(dest: Path) -> Path:
    """Copy the shipped tasks to ``dest`` with their data_files made absolute (lm-eval 0.4.13 hands
    ``dataset_kwargs`` to datasets.load_dataset unchanged (lm_eval/api/task.py ConfigurableTask.download), and
    datasets resolves relative data_files against the working directory, not the YAML's folder)."""
    import yaml

    dest.mkdir(parents=True, exist_ok=True)
    for src in sorted(TASKS_DIR.glob("*.yaml")):
        cfg = yaml.safe_load(src.read_text(encoding="utf-8"))
        files = cfg["dataset_kwargs"]["data_files"]
        cfg["dataset_kwargs"]["data_files"] = {k: str((TASKS_DIR / v).resolve()) for k, v in files.items()}
        (dest / src.name).write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return dest


OFFLINE_PATTERNS = ("offline mode is enabled", "HF_HUB_OFFLINE", "Couldn't reach", "couldn't find cache",
                    "LocalEntryNotFoundError", "Max retries exceeded with url: /datasets")


def _stream(cmd: list[str], env: dict, log_path: Path, cwd: Path) -> tuple[int, str]:
    """Run ``cmd``, copying its output to stderr (lm-eval's own progress) and to ``log_path``; return its exit status
    and output."""
    out = []
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", bufsize=1)
        assert p.stdout is not None
        for line in p.stdout:
            sys.stderr.write(line)
            log.write(line)
            out.append(line)
        return p.wait(), "".join(out)


def _metrics(results: dict) -> dict:
    """lm-eval's results JSON (``results`` and ``groups``: ``"<metric>,<filter>"`` and
    ``"<metric>_stderr,<filter>"``, lm_eval/evaluator_utils.py) as {task: {"<metric>,<filter>": {value, stderr}}}."""
    out = {}
    for section in ("results", "groups"):
        for task, vals in (results.get(section) or {}).items():
            row = out.setdefault(task, {})
            for key, value in vals.items():
                if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                    continue
                metric, filt = key.split(",", 1)
                stderr = vals.get(f"{metric}_stderr,{filt}")
                row[key] = {"value": value, "stderr": stderr if isinstance(stderr, (int, float)) else None}
    return out


Z95 = 1.959963984540054
"""The two-sided 95% normal quantile: confidence intervals are ``difference ± Z95 * stderr``."""


@dataclass
class Scored:
    """One model's lm-eval results over the asked tasks, merged over its runs (one per request kind).

    ``metrics``: {task: {"<metric>,<filter>": {"value": float, "stderr": float or None}}} (lm-eval's own numbers);
    ``higher_is_better`` and ``aggregation``: {task: {metric: ...}} from its results JSON; ``samples``: {task: the
    path of its per-item log (``samples_<task>_<date>.jsonl``)}; ``wall_s``: seconds, lm-eval runs included."""

    metrics: dict
    n_samples: dict
    higher_is_better: dict
    aggregation: dict
    samples: dict
    versions: dict
    commands: list
    wall_s: float

    def record(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_record(cls, data: dict) -> "Scored":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class SourceModel:
    """The unquantized model a build is compared with, scored in-process by lm-eval's ``hf`` model (transformers).

    ``folder``: an HF checkpoint folder; ``digest``: what identifies its weights (the manifest's source sha256, or
    the reference's path); ``dtype``: lm-eval's ``dtype`` model argument (float32 on a CPU target, the way the
    pytorch runtime serves there; ``auto``, the checkpoint's, elsewhere); ``batch_size``: lm-eval's."""

    folder: Path
    digest: str
    label: str
    dtype: str = "auto"
    batch_size: str = "8"
    trust_remote_code: bool = False


def source_model(build, out: Path, override: str | None = None) -> SourceModel | None:
    """The model ``trtpipe eval`` scores beside the build ``build`` (builders.layout's resolved build) whose folder
    is ``out``, or None with the reason printed: ``override`` (``--source DIR``); else the build's manifest.json:
    its source checkpoint (path and sha256), or for a pre-quantized source ``model.reference``.

    Raises:
        PipelineError: ``override`` holds no config.json.
        SpecError: ``model.reference`` cannot be fetched (builders.model_fetch.resolve_source).
    """
    cpu = build.target == "cpu"  # the pytorch runtime serves float32 there
    opts = {"dtype": "float32" if cpu else "auto", "batch_size": "8" if cpu else "auto",
            "trust_remote_code": bool(build.model.trust_remote_code)}
    if override:
        folder = Path(override).resolve()
        if not (folder / "config.json").is_file():
            raise PipelineError(f"--source {override}: no config.json there; pass a Hugging Face checkpoint folder "
                                "(config.json, *.safetensors, tokenizer), or --no-source")
        return SourceModel(folder, f"path:{folder}", str(override), **opts)
    manifest = out / "manifest.json"
    if not manifest.is_file():
        print(f"note: no source scored: {out} has no manifest.json (build it first, or pass --source DIR)")
        return None
    record = json.loads(manifest.read_text()).get("source_checkpoint") or {}
    if record.get("quantization"):
        ref = build.model.reference
        if not ref:
            print("note: no source scored: model.source is already quantized and model.reference names no "
                  "unquantized model (set it, or pass --source DIR)")
            return None
        from builders.model_fetch import resolve_source

        return SourceModel(resolve_source(ref, field="model.reference"), f"reference:{ref}", ref, **opts)
    folder = Path(record.get("path", ""))
    if not (folder / "config.json").is_file():
        print(f"note: no source scored: the source checkpoint the manifest records ({folder}) is gone (rebuild, or "
              "pass --source DIR)")
        return None
    return SourceModel(folder, record.get("sha256") or f"path:{folder}", build.model.source, **opts)


def _groups(plan: TaskPlan, tasks: list[str]) -> dict[str, list[str]]:
    """Tasks by the model lm-eval runs them with. A group mixing both kinds goes to ``local-completions``, which
    answers generate_until too (without the chat template, as lm-eval runs a base model): one run scores the
    whole group, so its aggregate is lm-eval's own."""
    groups: dict[str, list[str]] = {}
    for t in tasks:
        kind = model_kind(plan.kinds[t])
        groups.setdefault("local-completions" if kind == "mixed" else kind, []).append(t)
    return groups


def _lm_eval_runs(lm_eval: Path, *, dest: Path, groups: dict[str, list[str]], model_for, include: list[Path],
                  limit: float | None, env: dict, log: Path, offline: bool, extra_args: list[str] | None,
                  log_samples: bool = True) -> Scored:
    """Run lm_eval once per request kind of ``groups`` with ``model_for(kind) -> (model, model_args, more_argv)``;
    merge its results JSONs into one :class:`Scored`. Raises EvalError (lm-eval's own failure, mapped)."""
    merged: dict = {"results": {}, "groups": {}, "versions": {}, "n-samples": {}, "configs": {}, "higher_is_better": {}}
    samples, commands, t0 = {}, [], time.perf_counter()
    for kind, names in groups.items():
        model, args, more = model_for(kind)
        out = dest / kind
        cmd = [str(lm_eval), "--model", model, "--model_args", ",".join(f"{k}={v}" for k, v in args.items()),
               "--tasks", ",".join(names), "--output_path", str(out), *more]
        if include:
            cmd += ["--include_path", os.pathsep.join(str(p) for p in include)]
        if kind == "local-chat-completions":
            cmd.append("--apply_chat_template")
        if limit is not None:
            cmd += ["--limit", f"{limit:g}"]
        if log_samples:
            cmd.append("--log_samples")
        cmd += list(extra_args or [])
        commands.append(shlex.join(cmd))
        rc, text = _stream(cmd, env, log, Path.cwd())
        if rc != 0:
            raise _failure(text, names, offline, log)
        found = sorted(out.rglob("results_*.json"))
        if not found:
            raise EvalError(f"lm_eval wrote no results under {out} (log: {log})", "lm_eval_failed")
        res = json.loads(found[-1].read_text(encoding="utf-8"))
        for key in merged:
            merged[key].update(res.get(key) or {})
        for task in res.get("results") or {}:
            logs = sorted(p for p in out.rglob("samples_*.jsonl")
                          if re.fullmatch(rf"samples_{re.escape(task)}_\d{{4}}-.*\.jsonl", p.name))
            if logs:
                samples[task] = str(logs[-1])
    aggregation = {t: {m["metric"]: m.get("aggregation") for m in (cfg.get("metric_list") or [])
                       if isinstance(m, dict) and "metric" in m}
                   for t, cfg in merged["configs"].items()}
    return Scored(metrics=_metrics(merged), n_samples=merged["n-samples"], higher_is_better=merged["higher_is_better"],
                  aggregation=aggregation, samples=samples, versions=merged["versions"], commands=commands,
                  wall_s=round(time.perf_counter() - t0, 3))


def _prepare(out_parent: Path, tasks: list[str], include: list[Path] | None) -> tuple[Path, Path, list[Path], TaskPlan]:
    """lm-eval, a new run folder under ``out_parent/eval/``, the include paths (the shipped tasks first when asked)
    and lm-eval's plan of the tasks; no run folder is left when a check fails."""
    lm_eval = find_lm_eval()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir, n = out_parent / "eval" / stamp, 1
    while run_dir.exists():
        run_dir, n = out_parent / "eval" / f"{stamp}-{n}", n + 1
    include = [Path(p).resolve() for p in (include or [])]
    for p in include:
        if not p.is_dir():
            raise EvalError(f"--include-path {p} is not a folder of lm-eval task YAMLs", "unknown_task")
    run_dir.mkdir(parents=True)
    try:
        if any(t in SHIPPED for t in tasks):
            include = [materialize_shipped(run_dir / "tasks"), *include]
        plan = probe_tasks(lm_eval, tasks, include)
        check_local_data(plan, Path.cwd())
    except BaseException:  # nothing ran: no run folder is left behind
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return lm_eval, run_dir, include, plan


def _env(offline: bool) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return env


def score_endpoint(lm_eval: Path, *, dest: Path, plan: TaskPlan, tasks: list[str], url: str, model: str,
                   tokenizer: Path | None, include: list[Path], limit: float | None = None, num_concurrent: int = 1,
                   max_retries: int = 3, offline: bool = False, extra_args: list[str] | None = None,
                   log_samples: bool = True) -> Scored:
    """Score ``tasks`` on the OpenAI-compatible server at ``url`` (``local-completions`` /
    ``local-chat-completions``); lm-eval's output under ``dest``. Raises EvalError."""
    groups = _groups(plan, tasks)
    if tokenizer is None and "local-completions" in groups:
        raise EvalError("log-likelihood tasks need the model's tokenizer and this build has no engine/ folder: "
                        "build it first (`trtpipe build`)", "no_tokenizer")

    def model_for(kind):
        endpoint = "completions" if kind == "local-completions" else "chat/completions"
        args = {"model": model, "base_url": f"{url}/v1/{endpoint}", "num_concurrent": num_concurrent,
                "max_retries": max_retries}
        if tokenizer is not None:
            args["tokenizer"] = str(tokenizer)
        return kind, args, []

    dest.mkdir(parents=True, exist_ok=True)
    env = _env(offline)
    if api_key():
        env["OPENAI_API_KEY"] = api_key()  # lm-eval's API models send this one as the bearer token
    return _lm_eval_runs(lm_eval, dest=dest, groups=groups, model_for=model_for, include=include, limit=limit,
                         env=env, log=dest / "lm_eval.log", offline=offline, extra_args=extra_args,
                         log_samples=log_samples)


def _tasks_digest(include: list[Path]) -> str:
    """SHA-256 over the task files lm-eval reads from ``include`` (YAML, data, Python), with their data files'
    contents where a YAML names absolute ones (the shipped tasks)."""
    h = hashlib.sha256()
    for folder in include:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and p.suffix in (".yaml", ".yml", ".json", ".jsonl", ".py", ".txt", ".csv"):
                h.update(p.name.encode() + b"\0" + p.read_bytes())
                if p.suffix in (".yaml", ".yml"):
                    for m in re.finditer(r"^\s+\w+: (/\S+)$", p.read_text(encoding="utf-8", errors="replace"), re.M):
                        if Path(m.group(1)).is_file():
                            h.update(Path(m.group(1)).read_bytes())
    return h.hexdigest()


def score_source(lm_eval: Path, *, source: SourceModel, plan: TaskPlan, tasks: list[str], include: list[Path],
                 limit: float | None = None, offline: bool = False, extra_args: list[str] | None = None,
                 cache: Path | None = None) -> tuple[Scored, Path, bool]:
    """Score ``tasks`` on the source model in-process (lm-eval's ``hf`` model; ``--apply_chat_template`` for the
    generate_until ones, as the served build's chat endpoint applies it). Results are kept in
    ``<cache>/eval/source-<key>/`` (key: the source's digest, tasks, limit, task files, dtype, batch size, lm-eval
    version) and reused: several builds of one source score it once. Returns (scores, that folder, reused).
    Raises EvalError."""
    from plugins.fsutil import cache_root

    key = hashlib.sha256(json.dumps({
        "source": source.digest, "tasks": tasks, "limit": limit, "lm_eval": plan.version, "dtype": source.dtype,
        "batch_size": source.batch_size, "task_files": _tasks_digest(include), "extra": extra_args or [],
    }, sort_keys=True).encode()).hexdigest()[:16]
    folder = (cache or cache_root()) / "eval" / f"source-{key}"
    done = folder / "scored.json"
    if done.is_file():
        return Scored.from_record(json.loads(done.read_text(encoding="utf-8"))), folder, True

    def model_for(kind):
        args = {"pretrained": str(source.folder), "dtype": source.dtype}
        if source.trust_remote_code:
            args["trust_remote_code"] = True
        return "hf", args, ["--batch_size", source.batch_size]

    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        scored = _lm_eval_runs(lm_eval, dest=tmp, groups=_groups(plan, tasks), model_for=model_for, include=include,
                               limit=limit, env=_env(offline), log=tmp / "lm_eval.log", offline=offline,
                               extra_args=extra_args)
        scored.samples = {t: str(folder / Path(p).relative_to(tmp)) for t, p in scored.samples.items()}
        (tmp / "scored.json").write_text(json.dumps(scored.record(), indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return scored, folder, False


def _per_item(path: str | None, metric: str, filt: str) -> dict | None:
    """{doc_id: (doc_hash, value)} of one metric and filter from an lm-eval samples log; None without one."""
    if not path or not Path(path).is_file():
        return None
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("filter", "none") == filt and isinstance(row.get(metric), (int, float)):
            out[row["doc_id"]] = (row.get("doc_hash"), float(row[metric]))
    return out


def _paired_stderr(build: Scored, source: Scored, task: str, metric: str, filt: str) -> float | None:
    """Standard error of the mean per-item difference (build - source) over the items both scored, for a metric
    lm-eval aggregates by ``mean``; None where that does not apply (other aggregations, groups, no samples logs,
    items that differ)."""
    if build.aggregation.get(task, {}).get(metric) != "mean" or source.aggregation.get(task, {}).get(metric) != "mean":
        return None
    b, s = _per_item(build.samples.get(task), metric, filt), _per_item(source.samples.get(task), metric, filt)
    if not b or not s or set(b) != set(s) or any(b[d][0] != s[d][0] for d in b) or len(b) < 2:
        return None
    diffs = [b[d][1] - s[d][1] for d in sorted(b)]
    mean = sum(diffs) / len(diffs)
    var = sum((x - mean) ** 2 for x in diffs) / (len(diffs) - 1)  # as lm-eval's mean_stderr: sample variance
    return math.sqrt(var / len(diffs))


def compare(build: Scored, source: Scored) -> dict:
    """Per task and metric: both scores with lm-eval's standard errors, the difference (build - source) with its
    95% confidence interval, and ``drop_pct``, the build's loss relative to the source in percent (positive: worse;
    for a lower-is-better metric such as perplexity, its rise; None where the source scores 0 and the build no
    worse).

    The interval is paired (per-item differences over the same items: :func:`_paired_stderr`) where lm-eval
    aggregates the metric by ``mean`` and both logged the same items, else sqrt(se_build^2 + se_source^2), which is
    wider (``paired`` says which). Returns {task: {"<metric>,<filter>": {...}}}."""
    out: dict = {}
    for task, metrics in build.metrics.items():
        theirs = source.metrics.get(task) or {}
        for key, b in metrics.items():
            s = theirs.get(key)
            if s is None:
                continue
            metric, filt = key.split(",", 1)
            higher = build.higher_is_better.get(task, {}).get(metric, True)
            diff = b["value"] - s["value"]
            se = _paired_stderr(build, source, task, metric, filt)
            paired = se is not None
            if se is None and b["stderr"] is not None and s["stderr"] is not None:
                se = math.hypot(b["stderr"], s["stderr"])
            loss = (-diff if higher else diff) + 0.0  # + 0.0: no "-0.0" in a table
            # a source scoring 0 leaves no share to lose: n/a (None), and a loss from 0 counts as all of it
            drop_pct = 100.0 * loss / abs(s["value"]) if s["value"] else (None if loss <= 0 else 100.0)
            out.setdefault(task, {})[key] = {
                "build": b["value"], "build_stderr": b["stderr"], "source": s["value"], "source_stderr": s["stderr"],
                "higher_is_better": higher, "difference": diff, "difference_stderr": se, "paired": paired,
                "ci95": None if se is None else [diff - Z95 * se, diff + Z95 * se], "drop_pct": drop_pct,
                "significant": None if se is None else abs(diff) > Z95 * se}
    return out


def gate(comparison: dict, max_task_drop_pct: float | None) -> dict:
    """The ``gates.max_task_drop_pct`` verdict: every task metric whose ``drop_pct`` exceeds it fails (the point
    estimate; the interval is reported beside it). ``passed`` None: no gate set."""
    if max_task_drop_pct is None:
        return {"max_task_drop_pct": None, "passed": None, "failed": []}
    failed = [{"task": task, "metric": key, "drop_pct": round(c["drop_pct"], 4), "source": c["source"],
               "build": c["build"]}
              for task, metrics in comparison.items() for key, c in metrics.items()
              if c["drop_pct"] is not None and c["drop_pct"] > max_task_drop_pct]
    return {"max_task_drop_pct": max_task_drop_pct, "passed": not failed, "failed": failed}


def run_eval(*, out: Path, tasks: list[str], url: str, tokenizer: Path | None, model: str | None = None,
             include: list[Path] | None = None, limit: float | None = None, num_concurrent: int = 1,
             max_retries: int = 3, offline: bool = False, extra_args: list[str] | None = None,
             source: SourceModel | None = None, max_task_drop_pct: float | None = None,
             label: str | None = None, log_samples: bool = True) -> tuple[Path, dict]:
    """Evaluate ``tasks`` on the OpenAI-compatible server at ``url`` with lm-eval and, given ``source``, the same
    tasks on the source model in-process; write ``out/eval/<timestamp>/`` (lm-eval's output under ``build/`` and
    ``source`` is a link to the cached source run, report.json, report.md) and return that folder and the report.

    Shipped tasks (:data:`SHIPPED`) run offline always; other tasks only with ``offline``. Nothing outside
    ``out/eval/`` and the cache is written (the manifest record is the caller's: :func:`record_in_manifest`).

    Raises:
        EvalError: lm-eval missing, the server unreachable, an unknown task, missing data, lm-eval failing.
    """
    url = url.rstrip("/").removesuffix("/v1")
    ids = served_models(url)
    model = model or (ids[0] if ids else None)
    if not model:
        raise EvalError(f"{url}/v1/models lists no model: pass --model NAME", "unreachable")
    lm_eval, run_dir, include, plan = _prepare(out, tasks, include)
    offline = offline or any(t in SHIPPED for t in tasks)
    t0 = time.perf_counter()
    try:
        built = score_endpoint(lm_eval, dest=run_dir / "build", plan=plan, tasks=tasks, url=url, model=model,
                               tokenizer=tokenizer, include=include, limit=limit, num_concurrent=num_concurrent,
                               max_retries=max_retries, offline=offline, extra_args=extra_args,
                               log_samples=log_samples)
        src = src_dir = None
        reused = False
        if source is not None:
            src, src_dir, reused = score_source(lm_eval, source=source, plan=plan, tasks=tasks, include=include,
                                                limit=limit, offline=offline, extra_args=extra_args)
    except BaseException:
        if not any((run_dir / "build").rglob("results_*.json")):
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing was scored: no run folder is left behind
        raise
    comparison = compare(built, src) if src is not None else {}
    report = {"label": label, "url": url, "model": model, "tasks": tasks, "lm_eval_version": plan.version,
              "lm_eval": str(lm_eval), "offline": offline, "limit": limit, "num_concurrent": num_concurrent,
              "max_retries": max_retries, "tokenizer": str(tokenizer) if tokenizer else None,
              "commands": built.commands, "wall_s": round(time.perf_counter() - t0, 3),
              "output_types": {t: plan.kinds[t] for t in tasks},
              "metrics": built.metrics, "n_samples": built.n_samples, "versions": built.versions,
              "build": {"wall_s": built.wall_s, "samples": built.samples},
              "source": None if source is None else {
                  "folder": str(source.folder), "digest": source.digest, "label": source.label, "dtype": source.dtype,
                  "results": str(src_dir), "reused": reused, "wall_s": src.wall_s, "commands": src.commands,
                  "metrics": src.metrics},
              "comparison": comparison,
              "gate": gate(comparison, max_task_drop_pct) if source is not None else
              {"max_task_drop_pct": max_task_drop_pct, "passed": None, "failed": [],
               "note": "no source scored: nothing to compare with"}}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (run_dir / "report.md").write_text(table(report) + "\n", encoding="utf-8")
    return run_dir, report


def record_in_manifest(manifest_path: Path, run_dir: Path, report: dict) -> None:
    """Append the run's summary to the build's manifest.json ``evaluations`` list (under the build's lock, written
    atomically); nothing else of the manifest changes. No manifest (an unbuilt folder): nothing is written."""
    from plugins.fsutil import build_lock, write_json

    if not manifest_path.is_file():
        return
    summary = {"run": str(run_dir), "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "url": report["url"], "model": report["model"], "tasks": report["tasks"], "limit": report["limit"],
               "lm_eval_version": report["lm_eval_version"],
               "scores": {t: {k: m["value"] for k, m in ms.items()} for t, ms in report["metrics"].items()},
               "source": None if report["source"] is None else {
                   "digest": report["source"]["digest"],
                   "scores": {t: {k: m["value"] for k, m in ms.items()} for t, ms in report["source"]["metrics"].items()}},
               "gate": report["gate"]}
    with build_lock(manifest_path.parent):
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        manifest.setdefault("evaluations", []).append(summary)
        write_json(manifest_path, manifest)

def _failure(text: str, tasks: list[str], offline: bool, log: Path) -> EvalError:
    """lm-eval's failure as one EvalError: its unknown-task and offline-dataset messages mapped to ours."""
    m = re.search(r"Tasks not found: ([^\n]+)", text)
    if m:
        return EvalError(f"unknown task {m.group(1).strip()}: lm-eval has no task of that name; `lm_eval ls tasks` "
                         "lists them, --include-path DIR adds a folder of task YAMLs", "unknown_task")
    if any(p.lower() in text.lower() for p in OFFLINE_PATTERNS):
        mode = "offline (--offline or a shipped task)" if offline else "without network access"
        return EvalError(f"the dataset of {', '.join(tasks)} is not in the Hugging Face cache and cannot be "
                         f"downloaded {mode}: run once online (without --offline) to cache it, or point "
                         f"HF_HOME at a cache that has it (log: {log})", "dataset_offline")
    tail = "\n".join(text.strip().splitlines()[-15:])
    return EvalError(f"lm_eval failed on {', '.join(tasks)} (log: {log}):\n{tail}", "lm_eval_failed")


def _pm(value: float, stderr: float | None) -> str:
    return f"{value:.4f}" + ("" if stderr is None else f" ± {stderr:.4f}")


def table(report: dict) -> str:
    """The report as a markdown table. Without a source: task, metric (with lm-eval's filter), value, stderr. With
    one: source and build (± lm-eval's standard error), the difference with its 95% interval, the drop in percent
    and, with ``gates.max_task_drop_pct``, each row's verdict; then the gate's line."""
    comparison = report.get("comparison") or {}
    if not comparison:
        rows = ["| task | metric | value | stderr |", "|---|---|---:|---:|"]
        for task, metrics in report["metrics"].items():
            for key, m in metrics.items():
                err = "" if m["stderr"] is None else f"{m['stderr']:.4f}"
                rows.append(f"| {task} | {key} | {m['value']:.4f} | {err} |")
        return "\n".join(rows)
    g = report.get("gate") or {}
    limit = g.get("max_task_drop_pct")
    rows = ["| task | metric | source | build | build - source [95% CI] | drop % |" + (" gate |" if limit is not None
                                                                                    else ""),
            "|---|---|---:|---:|---:|---:|" + ("---|" if limit is not None else "")]
    for task, metrics in comparison.items():
        for key, c in metrics.items():
            ci = "" if c["ci95"] is None else f" [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]"
            arrow = "↑" if c["higher_is_better"] else "↓"
            drop = "n/a" if c["drop_pct"] is None else f"{c['drop_pct']:+.2f}"
            row = (f"| {task} | {key} {arrow} | {_pm(c['source'], c['source_stderr'])} | "
                   f"{_pm(c['build'], c['build_stderr'])} | {c['difference']:+.4f}{ci} | {drop} |")
            if limit is not None:
                row += " fail |" if c["drop_pct"] is not None and c["drop_pct"] > limit else " pass |"
            rows.append(row)
    if limit is not None:
        verdict = ("passed" if g["passed"] else "FAILED: " + ", ".join(f"{f['task']} {f['metric']} "
                                                                         f"{f['drop_pct']:+.2f}%" for f in g["failed"]))
        rows.append(f"\ngates.max_task_drop_pct {limit:g}: {verdict}")
    return "\n".join(rows)


def side_by_side(reports: list[dict]) -> str:
    """Several builds' reports as one markdown table: a row per task metric, the source's score (where one was
    scored) and each build's, with its drop in percent against that source."""
    labels = [r.get("label") or r["model"] for r in reports]
    source = next((r["source"] for r in reports if r.get("source")), None)
    rows = ["| task | metric |" + (" source |" if source else "") + "".join(f" {lb} |" for lb in labels),
            "|---|---|" + ("---:|" if source else "") + "---:|" * len(labels)]
    keys = [(t, k) for t, ms in reports[0]["metrics"].items() for k in ms]
    for r in reports[1:]:
        keys += [(t, k) for t, ms in r["metrics"].items() for k in ms if (t, k) not in keys]
    for task, key in keys:
        row = f"| {task} | {key} |"
        if source:
            m = source["metrics"].get(task, {}).get(key)
            row += f" {_pm(m['value'], m['stderr'])} |" if m else " |"
        for r in reports:
            m = r["metrics"].get(task, {}).get(key)
            c = (r.get("comparison") or {}).get(task, {}).get(key)
            row += (" |" if m is None else f" {_pm(m['value'], m['stderr'])}" +
                    (f" ({c['drop_pct']:+.1f}%)" if c and c["drop_pct"] is not None else "") + " |")
        rows.append(row)
    return "\n".join(rows)
