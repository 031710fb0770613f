"""`make query PROMPT=...` hands the prompt to trtpipe as the user wrote it: double quotes, backquotes and non-ASCII
text included (the recipe reads it from the environment; before, `"$(PROMPT)"` in the recipe dropped the quotes).
A stand-in prints the argument trtpipe would get; nothing is served."""

from __future__ import annotations

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
