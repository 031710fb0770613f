"""``trtpipe eval``: score a served build with lm-evaluation-harness (pinned 0.4.13, its own venv ``.lmeval/``,
its own task registry) through an OpenAI-compatible endpoint, by default the build's ``trtpipe serve`` frontend.

lm-eval runs as its own process (:func:`run_eval`): ``local-completions`` (``<url>/v1/completions``) for the tasks
whose requests are log-likelihoods and ``local-chat-completions`` (``<url>/v1/chat/completions``,
``--apply_chat_template``) for ``generate_until`` tasks, decided per task from lm-eval's own task config
(``output_type``, read by pipeline/lm_eval_probe.py from lm_eval/tasks/_index.py's index). The tokenizer is the
build's ``engine/`` folder, so lm-eval downloads nothing for the model. The results go to
``build/<name>/<target>/eval/<timestamp>/``: lm-eval's own output (``lm_eval/``), its log and ``report.json``;
nothing else of the build folder is written.

The project ships two small tasks of its own (:data:`SHIPPED`, ``pipeline/eval_tasks/``), on text written for this
project, so that ``trtpipe eval --tasks trtpipe_mc,trtpipe_gen`` works offline.
"""

from __future__ import annotations

import json
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
SHIPPED = ("trtpipe_mc", "trtpipe_gen")
LOGLIKELIHOOD_TYPES = frozenset({"loglikelihood", "loglikelihood_rolling", "multiple_choice"})
"""lm-eval 0.4.13's output_type values answered with log-likelihoods (lm_eval/api/task.py ConfigurableTask
construct_requests): sent to ``local-completions`` (echo + logprobs); ``generate_until`` goes to chat."""
LM_EVAL_ENV = "TRTPIPE_LM_EVAL"


class EvalError(PipelineError):
    """``trtpipe eval`` cannot run or lm-eval failed: the message says why and what to do; ``code`` is stable
    (``no_lm_eval``, ``no_server``, ``unreachable``, ``unknown_task``, ``missing_data``, ``dataset_offline``,
    ``no_tokenizer``, ``lm_eval_failed``)."""

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

    status = server_status(state_path) or {}
    front = status.get("openai") or {}
    if status.get("running") and status.get("openai_running") and front.get("url"):
        return front["url"]
    if status.get("server") == "trtllm-serve" and status.get("running"):
        return "http://" + status["http"].split("://", 1)[-1]
    raise EvalError(f"no OpenAI frontend of this build runs (none recorded in {state_path}): start one with "
                    f"`{again} --detach`, or pass --url http://HOST:PORT of any OpenAI-compatible server",
                    "no_server")


def served_models(url: str, timeout: float = 10.0) -> list[str]:
    """The model ids ``<url>/v1/models`` lists; EvalError ``unreachable`` naming the URL and the fix."""
    target = url.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as r:
            body = json.loads(r.read().decode())
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
                        "`lm_eval ls tasks` lists them, --include-path DIR adds a folder of task YAMLs",
                        "unknown_task")
    return TaskPlan(out.get("version"), out["tasks"], out.get("datasets") or {})


def model_kind(output_types: list[str]) -> str:
    """``local-completions`` when every output_type is a log-likelihood one, ``local-chat-completions`` when all
    are ``generate_until``; a group mixing both is run as both (see :func:`run_eval`)."""
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


def run_eval(*, out: Path, tasks: list[str], url: str, tokenizer: Path | None, model: str | None = None,
             include: list[Path] | None = None, limit: float | None = None, num_concurrent: int = 1,
             max_retries: int = 3, offline: bool = False, extra_args: list[str] | None = None,
             log_samples: bool = True) -> tuple[Path, dict]:
    """Evaluate ``tasks`` on the OpenAI-compatible server at ``url`` with lm-eval; write
    ``out/eval/<timestamp>/`` and return that folder and its report (see the module docstring).

    Shipped tasks (:data:`SHIPPED`) run offline always; other tasks only with ``offline``.
    """
    lm_eval = find_lm_eval()
    url = url.rstrip("/").removesuffix("/v1")
    ids = served_models(url)
    model = model or (ids[0] if ids else None)
    if not model:
        raise EvalError(f"{url}/v1/models lists no model: pass --model NAME", "unreachable")
    run_dir = out / "eval" / time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while run_dir.exists():
        run_dir = out / "eval" / f"{time.strftime('%Y%m%d-%H%M%S')}-{n}"
        n += 1
    include = [Path(p).resolve() for p in (include or [])]
    for p in include:
        if not p.is_dir():
            raise EvalError(f"--include-path {p} is not a folder of lm-eval task YAMLs", "unknown_task")
    shipped = [t for t in tasks if t in SHIPPED]
    run_dir.mkdir(parents=True)
    if shipped:
        include = [materialize_shipped(run_dir / "tasks"), *include]
    offline = offline or bool(shipped)
    cwd = Path.cwd()
    try:
        plan = probe_tasks(lm_eval, tasks, include)
        check_local_data(plan, cwd)
    except EvalError:  # nothing ran: no run folder is left behind
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    groups: dict[str, list[str]] = {}
    for t in tasks:
        kind = model_kind(plan.kinds[t])
        for k in (("local-completions", "local-chat-completions") if kind == "mixed" else (kind,)):
            groups.setdefault(k, []).append(t)
    if tokenizer is None and "local-completions" in groups:
        raise EvalError("log-likelihood tasks need the model's tokenizer and this build has no engine/ folder: "
                        "build it first (`trtpipe build`)", "no_tokenizer")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    commands, t0 = [], time.perf_counter()
    merged: dict = {"results": {}, "groups": {}, "versions": {}, "n-samples": {}, "configs": {}}
    for kind, names in groups.items():
        endpoint = "completions" if kind == "local-completions" else "chat/completions"
        args = {"model": model, "base_url": f"{url}/v1/{endpoint}", "num_concurrent": num_concurrent,
                "max_retries": max_retries}
        if tokenizer is not None:
            args["tokenizer"] = str(tokenizer)
        dest = run_dir / "lm_eval" / kind
        cmd = [str(lm_eval), "--model", kind, "--model_args", ",".join(f"{k}={v}" for k, v in args.items()),
               "--tasks", ",".join(names), "--output_path", str(dest)]
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
        rc, text = _stream(cmd, env, run_dir / "lm_eval.log", cwd)
        if rc != 0:
            raise _failure(text, names, offline, run_dir / "lm_eval.log")
        found = sorted(dest.rglob("results_*.json"))
        if not found:
            raise EvalError(f"lm_eval wrote no results under {dest} (log: {run_dir / 'lm_eval.log'})",
                            "lm_eval_failed")
        res = json.loads(found[-1].read_text(encoding="utf-8"))
        for key in merged:
            merged[key].update(res.get(key) or {})
    report = {"url": url, "model": model, "tasks": tasks, "lm_eval_version": plan.version, "lm_eval": str(lm_eval),
              "offline": offline, "limit": limit, "num_concurrent": num_concurrent, "max_retries": max_retries,
              "tokenizer": str(tokenizer) if tokenizer else None, "commands": commands,
              "wall_s": round(time.perf_counter() - t0, 3),
              "output_types": {t: plan.kinds[t] for t in tasks},
              "metrics": _metrics(merged), "n_samples": merged["n-samples"], "versions": merged["versions"]}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (run_dir / "report.md").write_text(table(report) + "\n", encoding="utf-8")
    return run_dir, report


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


def table(report: dict) -> str:
    """The report as a markdown table: task, metric (with lm-eval's filter), value, stderr."""
    rows = ["| task | metric | value | stderr |", "|---|---|---:|---:|"]
    for task, metrics in report["metrics"].items():
        for key, m in metrics.items():
            err = "" if m["stderr"] is None else f"{m['stderr']:.4f}"
            rows.append(f"| {task} | {key} | {m['value']:.4f} | {err} |")
    return "\n".join(rows)
