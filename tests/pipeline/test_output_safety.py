"""No user file is lost to an output path: plan --output, stage folders, atomic JSON writes."""

from __future__ import annotations

import json

import pytest

from pipeline.cache import run_stage
from pipeline.cli import main
from plugins.errors import PipelineError
from plugins.fsutil import write_json
from tests.conftest import REPO

BUILD = str(REPO / "configs" / "builds" / "smollm2-135m.yaml")


def test_plan_output_refuses_a_file_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("precious\n")
    assert main(["plan", BUILD, "--output", str(mine)]) == 2
    assert "exists and is not a plan.json" in capsys.readouterr().err
    assert mine.read_text() == "precious\n"
    assert main(["plan", BUILD, "--output", str(mine), "--force"]) == 0
    assert json.loads(mine.read_text())["build"] == "smollm2-135m"


def test_plan_output_replaces_its_own_plan_and_refuses_a_folder(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", BUILD, "--output", str(out)]) == 0
    assert main(["plan", BUILD, "--output", str(out)]) == 0  # its own file: replaced
    assert main(["plan", BUILD, "--output", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary file left


def test_a_stage_never_replaces_a_folder_it_did_not_write(tmp_path):
    user = tmp_path / "checkpoint"
    user.mkdir()
    (user / "weights.bin").write_text("mine")
    with pytest.raises(PipelineError, match="not written by trtpipe"):
        run_stage("checkpoint", user, "k1", lambda d: (d / "x").write_text("new") and {})
    assert (user / "weights.bin").read_text() == "mine" and not (user / "x").exists()
    # a stage folder of its own (stage.json) is replaced when its key changes
    ours = tmp_path / "engine"
    run_stage("engine", ours, "k1", lambda d: (d / "a").write_text("1") and {})
    run_stage("engine", ours, "k2", lambda d: (d / "b").write_text("2") and {})
    assert (ours / "b").is_file() and not (ours / "a").exists()


def test_a_stage_never_replaces_a_file_or_link_it_did_not_write(tmp_path):
    """Neither renamed aside nor deleted: a user's file, or a link (to a stage folder elsewhere), at a stage's path."""
    (tmp_path / "engine").write_text("mine")
    elsewhere = tmp_path / "elsewhere"
    run_stage("model_repo", elsewhere, "k1", lambda d: (d / "a").write_text("1") and {})
    (tmp_path / "model_repo").symlink_to(elsewhere)
    for name, what in (("engine", "a file"), ("model_repo", "a link")):
        with pytest.raises(PipelineError, match=f"not written by trtpipe \\({what}\\)"):
            run_stage(name, tmp_path / name, "k2", lambda d: (d / "b").write_text("2") and {})
    assert (tmp_path / "engine").read_text() == "mine" and (tmp_path / "model_repo").readlink() == elsewhere
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "engine", "model_repo"]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["a", "stage.json"]


def test_write_json_leaves_no_temporary_file_when_it_fails(tmp_path):
    target = tmp_path / "out.json"
    target.mkdir()
    with pytest.raises(OSError):
        write_json(target, {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
