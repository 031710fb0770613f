"""trtpipe processes run OpenMP threads passive (plugins.procenv, called where they start: the CLI's main, the
servers' environment): set before torch starts, inherited by the processes they start, and a user's own setting
wins."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import contextlib, io, os, subprocess, sys
import pipeline.cli
with contextlib.redirect_stdout(io.StringIO()):
    pipeline.cli.main(["schema"])  # the CLI's entry point, as `trtpipe schema` runs it
print(os.environ.get("OMP_WAIT_POLICY"))
print(subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                     capture_output=True, text=True).stdout.strip())
"""


def _run(env):
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_omp_threads_wait_passively_in_trtpipe_and_its_children():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _run(env) == ["PASSIVE", "PASSIVE"]


def test_a_users_omp_wait_policy_wins():
    assert _run({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE", "ACTIVE"]


def test_the_cli_imports_plugins_before_anything_imports_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, pipeline.cli; print('torch' in sys.modules)"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False"


def test_tritonserver_starts_with_passive_openmp_unless_the_user_said_otherwise():
    """The served models' processes (the pytorch runtime's engine worker runs torch) inherit it from tritonserver."""
    from pipeline.serve import server_environment

    assert server_environment({"PATH": "/usr/bin"})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert server_environment({"PATH": "/usr/bin", "OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
