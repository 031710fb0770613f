"""scripts/pip_index_args.py: pip's index settings handed to uv (set-up's uv finds what pip would)."""

from __future__ import annotations

import importlib.util
import subprocess

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("pip_index_args", REPO / "scripts" / "pip_index_args.py")
pia = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pia)


def test_pip_precedence_env_over_install_over_global(monkeypatch):
    out = ("global.index-url='https://a/simple'\ninstall.index-url='https://b/simple'\n"
           ":env:.find-links='/opt/wheels /opt/more'\nglobal.find-links='/nope'\nglobal.cert='/etc/ca.pem'\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    cfg = pia.pip_config()
    assert cfg == {"index-url": "https://b/simple", "find-links": "/opt/wheels /opt/more", "cert": "/etc/ca.pem"}


def test_uv_flags_keep_every_location_and_pips_best_match_rule():
    args = pia.uv_args({"index-url": "https://b/simple", "find-links": "/opt/wheels /opt/more",
                        "constraint": "/etc/c.txt", "no-index": "true"})
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert args[2:] == ["--index-url", "https://b/simple", "--find-links", "/opt/wheels", "--find-links",
                        "/opt/more", "--constraint", "/etc/c.txt", "--no-index"]
    assert "--no-index" not in pia.uv_args({"no-index": "false"})
