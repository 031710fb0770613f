"""``trtpipe eval`` (pipeline/evaluate.py): lm-evaluation-harness 0.4.13 against the served build.

The e2e tests run the shipped tasks (pipeline/eval_tasks/) through the real tritonserver and OpenAI frontend and
require exactly the numbers lm_eval's own CLI gives on the same endpoint (tests/pipeline/test_lm_eval.py's
run_lm_eval on tests/assets/lm_eval_tasks, the same items); the unit tests check the errors, each one clear
EvalError with a stable code.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import pytest

from pipeline.evaluate import (SHIPPED, TASKS_DIR, EvalError, TaskPlan, check_local_data, find_lm_eval,
                               materialize_shipped, model_kind, probe_tasks, served_models)
from tests.conftest import ASSETS, REPO

LM_EVAL = REPO / ".lmeval" / "bin" / "lm_eval"
needs_lm_eval = pytest.mark.skipif(not LM_EVAL.is_file(), reason=".lmeval/ missing: run `make setup`")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_shipped_tasks_are_the_test_assets_items():
    for name in ("mc.jsonl", "gen.jsonl"):
        assert (TASKS_DIR / name).read_bytes() == (ASSETS / "lm_eval_tasks" / name).read_bytes()


def test_shipped_tasks_get_absolute_data_files(tmp_path):
    import yaml

    dest = materialize_shipped(tmp_path / "tasks")
    names = set()
    for f in dest.glob("*.yaml"):
        cfg = yaml.safe_load(f.read_text(encoding="utf-8"))
        names.add(cfg["task"])
        for path in cfg["dataset_kwargs"]["data_files"].values():
            assert Path(path).is_absolute() and Path(path).is_file()
    assert names == set(SHIPPED)


def test_model_kind_follows_output_type():
    assert model_kind(["multiple_choice"]) == "local-completions"
    assert model_kind(["loglikelihood", "loglikelihood_rolling"]) == "local-completions"
    assert model_kind(["generate_until"]) == "local-chat-completions"
    assert model_kind(["generate_until", "multiple_choice"]) == "mixed"


def test_unreachable_url_is_one_clear_error():
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(EvalError) as exc:
        served_models(url, timeout=2)
    assert exc.value.code == "unreachable"
    assert f"{url}/v1/models" in str(exc.value) and "--url" in str(exc.value)


def test_missing_lm_eval_names_make_setup(monkeypatch, tmp_path):
    monkeypatch.setenv("TRTPIPE_LM_EVAL", str(tmp_path / "nope"))
    with pytest.raises(EvalError) as exc:
        find_lm_eval()
    assert exc.value.code == "no_lm_eval" and "TRTPIPE_LM_EVAL" in str(exc.value)


def test_missing_local_data_is_one_clear_error(tmp_path):
    plan = TaskPlan("0.4.13", {"mine": ["generate_until"]},
                    {"mine": {"path": "json", "data_files": ["data/items.jsonl"]}})
    with pytest.raises(EvalError) as exc:
        check_local_data(plan, tmp_path)
    assert exc.value.code == "missing_data" and "mine" in str(exc.value) and "data/items.jsonl" in str(exc.value)


def test_no_server_recorded_says_serve_or_url(tmp_path):
    from pipeline.evaluate import default_url

    with pytest.raises(EvalError) as exc:
        default_url(tmp_path / "server.json", "trtpipe serve")
    assert exc.value.code == "no_server" and "trtpipe serve --detach" in str(exc.value) and "--url" in str(exc.value)


@needs_lm_eval
def test_unknown_task_is_one_clear_error(tmp_path):
    with pytest.raises(EvalError) as exc:
        probe_tasks(LM_EVAL, ["trtpipe_mc", "no_such_task_xyz"], [materialize_shipped(tmp_path / "t")])
    assert exc.value.code == "unknown_task"
    assert "no_such_task_xyz" in str(exc.value) and "--include-path" in str(exc.value)
    assert "trtpipe_mc," not in str(exc.value)


@needs_lm_eval
def test_probe_reads_output_types_from_lm_evals_index(tmp_path):
    plan = probe_tasks(LM_EVAL, ["trtpipe_mc", "trtpipe_gen", "gsm8k"], [materialize_shipped(tmp_path / "t")])
    assert plan.version == "0.4.13"
    assert plan.kinds == {"trtpipe_mc": ["multiple_choice"], "trtpipe_gen": ["generate_until"],
                          "gsm8k": ["generate_until"]}


# ---------------------------------------------------------------------------------------------- e2e



def _digest(folder: Path) -> dict:
    """Every file of the build folder but eval/ (and server.json, which serve owns) with its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).parts[0] != "eval"
            and p.name != "server.json" and p.stat().st_size < 50_000_000}


@pytest.mark.e2e
@pytest.mark.slow
def test_trtpipe_eval_equals_lm_evals_own_run(frontend, built_default, tmp_path, capsys):  # noqa: F811
    from pipeline.cli import main
    from tests.pipeline.test_lm_eval import run_lm_eval

    before = _digest(built_default)
    url = frontend.launch.url
    rc = main(["eval", "--tasks", "trtpipe_mc,trtpipe_gen", "--url", url, "--max-retries", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| trtpipe_mc | acc,none |" in printed and "| trtpipe_gen | exact_match,none |" in printed
    run = sorted((built_default / "eval").iterdir())[-1]
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert report["url"] == url and report["model"] == "smollm2-135m" and report["lm_eval_version"] == "0.4.13"
    assert report["output_types"] == {"trtpipe_mc": ["multiple_choice"], "trtpipe_gen": ["generate_until"]}
    assert (run / "report.md").is_file() and (run / "lm_eval.log").is_file()
    assert _digest(built_default) == before  # the eval run never changes the build

    mc, _, _ = run_lm_eval(tmp_path / "mc", "local-completions", "completions", url, built_default / "engine",
                           "trtpipe_mc")
    gen, _, _ = run_lm_eval(tmp_path / "gen", "local-chat-completions", "chat/completions", url,
                            built_default / "engine", "trtpipe_gen", "--apply_chat_template")
    for task, ref in (("trtpipe_mc", mc), ("trtpipe_gen", gen)):
        theirs = ref["results"][task]
        ours = report["metrics"][task]
        assert set(ours) == {k for k in theirs if "," in k and "_stderr," not in k}
        for key, m in ours.items():
            metric, filt = key.split(",", 1)
            assert m["value"] == theirs[key], (task, key)
            assert m["stderr"] == theirs[f"{metric}_stderr,{filt}"], (task, key)
        assert report["n_samples"][task] == ref["n-samples"][task]


@pytest.mark.e2e
@pytest.mark.slow
def test_cli_errors_are_one_line_each(frontend, built_default, tmp_path, capsys, monkeypatch):  # noqa: F811
    from pipeline.cli import main

    url = frontend.launch.url
    assert main(["eval", "--tasks", "no_such_task_xyz", "--url", url]) == 2
    err = capsys.readouterr().err
    assert "unknown task no_such_task_xyz" in err and "--include-path" in err and "Traceback" not in err

    dead = f"http://127.0.0.1:{_free_port()}"
    assert main(["eval", "--tasks", "trtpipe_mc", "--url", dead]) == 2
    err = capsys.readouterr().err
    assert f"{dead}/v1/models does not answer" in err and "Traceback" not in err

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gone.yaml").write_text((REPO / "pipeline" / "eval_tasks" / "trtpipe_mc.yaml").read_text()
                                     .replace("task: trtpipe_mc", "task: trtpipe_gone")
                                     .replace("test: mc.jsonl", "test: nowhere/gone.jsonl"))
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--tasks", "trtpipe_gone", "--url", url, "--include-path", str(tasks), "--offline",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "task trtpipe_gone" in err and "nowhere/gone.jsonl" in err and "does not exist" in err


@pytest.mark.e2e
@pytest.mark.slow
def test_hub_dataset_offline_is_one_clear_error(frontend, built_default, tmp_path, capsys, monkeypatch):  # noqa: F811
    from pipeline.cli import main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache: gsm8k is not there
    assert main(["eval", "--tasks", "gsm8k", "--url", frontend.launch.url, "--offline", "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "gsm8k" in err and "cannot be downloaded offline" in err, err[-3000:]


from tests.pipeline.test_openai_frontend import frontend  # noqa: E402,F401  (the frontend on a free port, reused)
