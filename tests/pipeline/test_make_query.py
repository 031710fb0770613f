"""`make query PROMPT=...` hands the prompt to trtpipe as the user wrote it: double quotes, backquotes and non-ASCII
text included (the recipe reads it from the environment; before, `"$(PROMPT)"` in the recipe dropped the quotes).
A stand-in prints the argument trtpipe would get; nothing is served."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (scripts/setup.sh's machines have it)")
def test_make_query_passes_the_prompt_unchanged(tmp_path):
    printer = tmp_path / "argv.py"
    printer.write_text("import sys\nprint(sys.argv[-1])\n")
    prompt = 'Say "hi", it\'s `x` $HOME $5 $$y 東京 🐉 café'
    out = subprocess.run(["make", "-s", "--no-print-directory", "-o", ".venv/.setup-done", "query",
                          f"TRTPIPE={sys.executable} {printer}", f"PROMPT={prompt}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip("\n") == prompt


TRTPIPE_TARGETS = ["build-engine", "plan", "tune", "verify", "deploy", "serve", "stop", "query", "eval", "loadtest"]
"""The Makefile's targets that run trtpipe: each passes ``ARGS`` on (README: "`ARGS='...'` on to it")."""


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (scripts/setup.sh's machines have it)")
@pytest.mark.parametrize("target", TRTPIPE_TARGETS)
def test_every_trtpipe_target_passes_args_on(tmp_path, target):
    printer = tmp_path / "argv.py"
    printer.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    out = subprocess.run(["make", "-s", "--no-print-directory", "-o", ".venv/.setup-done", "-o", ".venv/.tools-done",
                          target, f"TRTPIPE={sys.executable} {printer}", "ARGS=--marker 'two words'", "PROMPT=hi"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[argv.index("--marker") + 1] == "two words", argv
    if target == "query":
        assert argv[-1] == "hi"  # the prompt stays the last argument
