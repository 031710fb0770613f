"""The server configuration ``trtpipe serve`` makes (pipeline.cli.server_config, pipeline.serve.ServerConfig):
which repository it serves and where it logs; no server is started."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serve_model_repo_that_is_not_a_repository_is_refused_before_starting(tmp_path, capsys):
    """`trtpipe serve --model-repo DIR` serves an edited copy of a repository; a folder without one
    fails at once with what is missing, and no server is started."""
    from pipeline.cli import main

    rc = main(["serve", "--model-repo", str(tmp_path), "--detach"])
    err = capsys.readouterr().err
    assert rc != 0
    assert str(tmp_path) in err and "tensorrt_llm/config.pbtxt missing" in err


def test_serve_model_repo_logs_beside_the_copy(tmp_path):
    """A served copy of a repository logs beside the copy, not over the build's own server log."""
    import argparse

    from builders.layout import build_dir, resolve_build
    from pipeline.cli import server_config

    copy = tmp_path / "edited" / "model_repo"
    (copy / "tensorrt_llm").mkdir(parents=True)
    (copy / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    args = argparse.Namespace(build=ROOT / "configs/builds/smollm2-135m.yaml", target="cpu", quant=None,
                              out=tmp_path / "out", model_repo=copy, http_port=None, grpc_port=None,
                              metrics_port=None, address="127.0.0.1", timeout=60)
    build = resolve_build(args.build, args.target, args.quant)
    assert server_config(args, build).log_file == tmp_path / "edited" / "tritonserver.log"
    args.model_repo = None
    (build_dir(build, args.out) / "model_repo" / "tensorrt_llm").mkdir(parents=True)
    (build_dir(build, args.out) / "model_repo" / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    assert server_config(args, build).log_file == build_dir(build, args.out) / "tritonserver.log"
