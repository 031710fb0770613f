"""What the CLI and the client tell a user to run next are ``trtpipe`` commands (an installed copy has no
Makefile), for the same build."""

from __future__ import annotations

from pipeline.cli import main
from tests.conftest import REPO


def test_an_unbuilt_query_names_the_trtpipe_build_of_the_same_build(tmp_path, capsys):
    spec = REPO / "configs" / "builds" / "llama-3-8b.yaml"
    rc = main(["query", "--build", str(spec), "--target", "h100", "--out", str(tmp_path), "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and f"run `trtpipe build {spec} --target h100 --out {tmp_path}` first" in err
    assert "`make " not in err


def test_an_unreachable_server_names_trtpipe_serve():
    import pytest

    from pipeline.client import stream_generate
    from pipeline.serve import free_ports
    from plugins.errors import PipelineError

    with pytest.raises(PipelineError, match=r"is the server running \(`trtpipe serve`\)\?"):
        list(stream_generate(f"127.0.0.1:{free_ports(1)[0]}", "hi", max_tokens=1))
