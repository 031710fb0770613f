"""Shared fixtures: the default build (built once per session, reused when up to date) and a
real tritonserver serving it on free ports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.fsutil import REPO_ROOT

DEFAULT_BUILD = REPO_ROOT / "configs" / "builds" / "smollm2-135m.yaml"


@pytest.fixture(scope="session")
def built_default():
    """Build the embedded default (SmolLM2-135M, int4_awq, pytorch runtime, cpu target).

    Uses the same ``build/`` folder as ``make build-engine``: stages whose keys match are
    reused, so a developer who already built pays nothing; a fresh CI clone builds once
    (about 2.5 minutes on 2 cores, mostly AWQ calibration).
    Returns the build folder (``build/smollm2-135m/cpu``).
    """
    from pipeline.build import build_dir, run_build
    from pipeline.spec import load_spec

    build = load_spec(DEFAULT_BUILD, "cpu")
    root = Path(os.environ["TRTPIPE_TEST_BUILD_ROOT"]) if os.environ.get("TRTPIPE_TEST_BUILD_ROOT") else None
    run_build(build, out_root=root, progress=False)
    return build_dir(build, root)


@pytest.fixture(scope="session")
def default_server(built_default, tmp_path_factory):
    """A real tritonserver on the default build's repository (free ports, 127.0.0.1)."""
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(model_repository=built_default / "model_repo", http_port=http, grpc_port=grpc,
                       metrics_port=metrics, log_file=tmp_path_factory.mktemp("server") / "tritonserver.log",
                       ready_timeout_s=300, python_path=default_sys_path())
    server = TritonServer(cfg).start()
    yield server
    server.stop()
