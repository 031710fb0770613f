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
from tests.conftest import ASSETS, DEFAULT_BUILD, REPO

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


def test_a_mixed_group_runs_once_on_completions():
    from pipeline.evaluate import _groups

    plan = TaskPlan("0.4.13", {"mc": ["multiple_choice"], "gen": ["generate_until"],
                               "both": ["generate_until", "multiple_choice"]})
    assert _groups(plan, ["mc", "gen", "both"]) == {"local-completions": ["mc", "both"],
                                                    "local-chat-completions": ["gen"]}


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

    with pytest.raises(EvalError) as exc:  # not built: build it first
        default_url(tmp_path / "server.json", "trtpipe serve --quant fp8")
    assert exc.value.code == "no_server" and "`trtpipe build --quant fp8`" in str(exc.value)
    (tmp_path / "model_repo").mkdir()
    with pytest.raises(EvalError) as exc:  # built, not served
        default_url(tmp_path / "server.json", "trtpipe serve")
    assert exc.value.code == "no_server" and "trtpipe serve --detach" in str(exc.value) and "--url" in str(exc.value)


def test_one_url_per_build(capsys):
    from pipeline.cli import main

    assert main(["eval", "a.yaml", "b.yaml", "--tasks", "trtpipe_mc", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "1 --url for 2 builds: give one --url per build" in err and "Traceback" not in err


@needs_lm_eval
def test_unknown_task_is_one_clear_error(tmp_path):
    with pytest.raises(EvalError) as exc:
        probe_tasks(LM_EVAL, ["trtpipe_mc", "no_such_task_xyz"], [materialize_shipped(tmp_path / "t")])
    assert exc.value.code == "unknown_task"
    assert "no_such_task_xyz" in str(exc.value) and "--include-path" in str(exc.value)
    assert f"`{LM_EVAL} ls tasks`" in str(exc.value) and "trtpipe_lastword" in str(exc.value)
    assert str(exc.value).startswith("unknown task no_such_task_xyz: ")  # the known one is not called unknown


@needs_lm_eval
def test_probe_reads_output_types_from_lm_evals_index(tmp_path):
    plan = probe_tasks(LM_EVAL, ["trtpipe_mc", "trtpipe_gen", "gsm8k"], [materialize_shipped(tmp_path / "t")])
    assert plan.version == "0.4.13"
    assert plan.kinds == {"trtpipe_mc": ["multiple_choice"], "trtpipe_gen": ["generate_until"],
                          "gsm8k": ["generate_until"]}


# ---------------------------------------------------------------------------------------------- e2e



def _digest(folder: Path) -> dict:
    """Every file of the build folder but eval/ (and server.json, which serve owns) with its sha256; the manifest
    without its ``evaluations`` (what trtpipe eval appends)."""
    out = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).parts[0] != "eval"
           and p.name not in ("server.json", "manifest.json") and p.stat().st_size < 50_000_000}
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("evaluations", None)
    return {**out, "manifest.json": manifest}


@pytest.mark.e2e
@pytest.mark.slow
def test_trtpipe_eval_equals_lm_evals_own_run(frontend, built_default, lm_eval_once, capsys):
    from pipeline.cli import main

    before = _digest(built_default)
    url = frontend.launch.url
    evaluations = len(json.loads((built_default / "manifest.json").read_text()).get("evaluations", []))
    rc = main(["eval", "--tasks", "trtpipe_mc,trtpipe_gen", "--url", url, "--max-retries", "1", "--no-source"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| trtpipe_mc | acc,none |" in printed and "| trtpipe_gen | exact_match,none |" in printed
    run = sorted((built_default / "eval").iterdir())[-1]
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    assert report["url"] == url and report["model"] == "smollm2-135m" and report["lm_eval_version"] == "0.4.13"
    assert report["output_types"] == {"trtpipe_mc": ["multiple_choice"], "trtpipe_gen": ["generate_until"]}
    assert (run / "report.md").is_file() and (run / "build" / "lm_eval.log").is_file()
    assert _digest(built_default) == before  # the eval run never changes the build
    recorded = json.loads((built_default / "manifest.json").read_text())["evaluations"]
    assert len(recorded) == evaluations + 1 and recorded[-1]["run"] == str(run)
    assert recorded[-1]["scores"]["trtpipe_mc"] == {k: m["value"] for k, m in report["metrics"]["trtpipe_mc"].items()}

    # lm_eval's own runs with what trtpipe eval gives it (local-completions sends token ids by default:
    # tokenized_requests=True), shared with tests/pipeline/test_lm_eval.py, which checks them against transformers
    mc, _, _ = lm_eval_once("local-completions", "completions", url, built_default / "engine", "trtpipe_mc",
                            tokenized_requests=True)
    gen, _, _ = lm_eval_once("local-chat-completions", "chat/completions", url, built_default / "engine",
                             "trtpipe_gen", "--apply_chat_template")
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


@pytest.mark.e2e
@pytest.mark.slow
def test_a_keyed_frontend_gets_the_key(default_server, built_default, tmp_path, capsys, monkeypatch):
    """A frontend started with $TRTPIPE_API_KEY: trtpipe eval without the key is one clear error (401 from
    /v1/models, naming the variable); with it, lm-eval's requests carry it (lm-eval sends $OPENAI_API_KEY) and the run completes."""
    from builders.spec import load_spec
    from pipeline.cli import main
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports

    monkeypatch.setenv("TRTPIPE_API_KEY", "k-" + "7" * 30)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), default_server.cfg, free_ports(1)[0],
                             built_default / "engine")
    launch.log_file = tmp_path / "openai_frontend.log"
    fe = OpenAIFrontend(launch).start()
    try:
        args = ["eval", "--tasks", "trtpipe_mc", "--limit", "2", "--no-source", "--max-retries", "1", "--url",
                fe.launch.url]
        monkeypatch.delenv("TRTPIPE_API_KEY")
        assert main(args) == 2
        err = capsys.readouterr().err
        assert "/v1/models answers 401" in err and "set TRTPIPE_API_KEY" in err
        monkeypatch.setenv("TRTPIPE_API_KEY", "k-" + "7" * 30)
        assert main(args) == 0
        assert "| trtpipe_mc | acc,none |" in capsys.readouterr().out
    finally:
        fe.stop(10)


def _gated_build(tmp_path: Path, built: Path, max_drop: float, name: str) -> Path:
    """The default build file named ``name`` with ``gates.max_task_drop_pct`` set, its build folder under
    ``tmp_path/out`` holding the default build's manifest and tokenizer (what trtpipe eval reads; the server is given
    with --url)."""
    import shutil

    import yaml

    spec = yaml.safe_load(DEFAULT_BUILD.read_text(encoding="utf-8"))
    spec["name"] = name
    spec.setdefault("gates", {})["max_task_drop_pct"] = max_drop
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    folder = tmp_path / "out" / name / "cpu"
    (folder / "engine").mkdir(parents=True)
    shutil.copy(built / "manifest.json", folder / "manifest.json")
    for f in (built / "engine").iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "config.json", "generation_config.json"):
            shutil.copy(f, folder / "engine" / f.name)
    return path


@pytest.fixture(scope="module")
def damaged_frontend(built_default, tmp_path_factory):
    """The default build's engine with noise (seeded, one standard deviation of each tensor) added to every MLP
    weight, served by its own tritonserver and OpenAI frontend: a deliberately damaged checkpoint."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from builders.spec import load_spec
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports
    from tests.conftest import start_server

    root = tmp_path_factory.mktemp("damaged")
    engine, repo = root / "engine", root / "model_repo"
    shutil.copytree(built_default / "engine", engine)
    shutil.copytree(built_default / "model_repo", repo)
    weights = load_file(engine / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    for name, w in weights.items():
        if ".mlp." in name:
            noise = torch.randn(w.shape, generator=g, dtype=torch.float32) * w.float().std()
            weights[name] = (w.float() + noise).to(w.dtype)
    save_file(weights, engine / "model.safetensors", metadata={"format": "pt"})
    for cfg in repo.glob("*/config.pbtxt"):
        cfg.write_text(cfg.read_text().replace(str(built_default / "engine"), str(engine)))
    server = start_server(repo, root)
    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), server.cfg, free_ports(1)[0], engine)
    launch.log_file = root / "openai_frontend.log"
    fe = OpenAIFrontend(launch).start()
    yield fe
    fe.stop(10)
    server.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_gate_passes_the_default_and_fails_a_damaged_checkpoint(frontend, damaged_frontend, built_default,  # noqa: F811
                                                               tmp_path, capsys):
    """Source (in-process, lm-eval's hf model) beside the served build on the shipped last-word task
    (loglikelihood) and trtpipe_gen (generate_until, chat template); the default passes
    ``gates.max_task_drop_pct: 60``, the damaged checkpoint fails it (exit 1); the source's numbers are lm-eval's own
    hf runs'."""
    import subprocess

    from pipeline.cli import main

    good_yaml = _gated_build(tmp_path, built_default, 60, "smollm2-135m")
    bad_yaml = _gated_build(tmp_path, built_default, 60, "smollm2-damaged")
    root = tmp_path / "out"
    assert main(["eval", str(good_yaml), str(bad_yaml), "--out", str(root), "--tasks", "trtpipe_lastword,trtpipe_gen",
                 "--limit", "20", "--max-retries", "1", "--url", frontend.launch.url,
                 "--url", damaged_frontend.launch.url]) == 1
    captured = capsys.readouterr()
    assert "gates.max_task_drop_pct 60: passed" in captured.out
    assert "gates.max_task_drop_pct failed for smollm2-damaged/cpu (int4_awq)" in captured.err
    assert "smollm2-135m/cpu (int4_awq)" not in captured.err
    assert "reused: scored before" in captured.out  # the source is scored once for both
    assert ("| task | metric | source | smollm2-135m/cpu (int4_awq) | smollm2-damaged/cpu (int4_awq) |"
            in captured.out)  # side by side

    def newest(name):
        folder = root / name / "cpu"
        report = json.loads(sorted((folder / "eval").glob("*/report.json"))[-1].read_text(encoding="utf-8"))
        return report, json.loads((folder / "manifest.json").read_text())["evaluations"][-1]

    good, good_rec = newest("smollm2-135m")
    bad, bad_rec = newest("smollm2-damaged")
    assert good["gate"]["passed"] is True and good_rec["gate"]["passed"] is True and good["source"]["dtype"] == "float32"
    acc = good["comparison"]["trtpipe_lastword"]["acc,none"]
    assert acc["paired"] and acc["ci95"][0] <= acc["difference"] <= acc["ci95"][1]
    assert acc["source"] == good["source"]["metrics"]["trtpipe_lastword"]["acc,none"]["value"]
    assert bad["gate"]["passed"] is False and bad_rec["gate"]["passed"] is False
    assert bad["source"]["metrics"] == good["source"]["metrics"]
    assert {f["metric"] for f in bad["gate"]["failed"]} >= {"perplexity,none"}

    assert set(good["comparison"]) == {"trtpipe_lastword", "trtpipe_gen"}
    assert good["source"]["metrics"]["trtpipe_gen"]["exact_match,none"]["value"] is not None

    # the source's numbers are what lm-eval's own hf runs give (generate_until with the chat template, as served)
    tasks = materialize_shipped(tmp_path / "tasks")
    for task, extra in (("trtpipe_lastword", []), ("trtpipe_gen", ["--apply_chat_template"])):
        ref = tmp_path / f"ref-{task}"
        cmd = [str(LM_EVAL), "--model", "hf", "--model_args", f"pretrained={good['source']['folder']},dtype=float32",
               "--batch_size", "8", "--tasks", task, "--limit", "20", "--include_path", str(tasks),
               "--output_path", str(ref), *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        assert p.returncode == 0, p.stderr[-3000:]
        theirs = json.loads(sorted(ref.rglob("results_*.json"))[-1].read_text())["results"][task]
        for key, m in good["source"]["metrics"][task].items():
            assert m["value"] == theirs[key], (task, key)
