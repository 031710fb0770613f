"""Where trtpipe finds tritonserver (pipeline.serve.tritonserver_binary): the project root's .triton/, else the
checkout's own (trtpipe run from another directory, as the build's `next:` line suggests), else a clear error."""

from __future__ import annotations

import pytest

import pipeline.serve as serve


def test_from_another_directory_the_checkouts_tritonserver_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTPIPE_TRITONSERVER", raising=False)
    monkeypatch.delenv("TRTPIPE_TRITON_HOME", raising=False)
    monkeypatch.setattr(serve, "TRITON_HOME", tmp_path / ".triton" / "pytriton" / "tritonserver")  # cwd's: none
    checkout = tmp_path / "checkout"
    (checkout / "bin").mkdir(parents=True)
    (checkout / "bin" / "tritonserver").write_text("")
    monkeypatch.setattr(serve, "CHECKOUT_TRITON", checkout)
    assert serve.tritonserver_binary() == checkout / "bin" / "tritonserver"


def test_none_anywhere_names_both_places_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTPIPE_TRITONSERVER", raising=False)
    monkeypatch.delenv("TRTPIPE_TRITON_HOME", raising=False)
    monkeypatch.setattr(serve, "TRITON_HOME", tmp_path / "a")
    monkeypatch.setattr(serve, "CHECKOUT_TRITON", tmp_path / "b")
    with pytest.raises(serve.ServerError) as err:
        serve.tritonserver_binary()
    assert str(tmp_path / "a") in str(err.value) and str(tmp_path / "b") in str(err.value)
    assert "TRTPIPE_TRITONSERVER" in str(err.value) and "make setup" in str(err.value)
