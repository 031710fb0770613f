"""Print the uv arguments that make `uv pip install` look where pip looks on this machine, one a line.

uv reads no pip.conf and no PIP_* variable, so without this a machine whose pip is set up to find a CPU build of
torch (a find-links folder, an extra index) or a mirror would get a different torch, or nothing, from uv. Read
with `python -m pip config list` (files and PIP_* variables, pip's own precedence: PIP_* over `install.` over
`global.`): index-url, extra-index-url, find-links, no-index and constraint become uv's flags of the same name;
`--index-strategy unsafe-best-match` is pip's rule (the best version across every index). `--cert` prints the
certificate bundle pip is set to use (uv takes it as SSL_CERT_FILE), or nothing.

    python scripts/pip_index_args.py [--cert]      (run with the python whose pip is asked: scripts/setup.sh's .venv)
"""

from __future__ import annotations

import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}


def pip_config() -> dict[str, str]:
    """pip's resolved settings for `pip install`: PIP_* variables over the `install` section over `global`."""
    r = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    ranked: dict[str, tuple[int, str]] = {}
    rank = {"global": 0, "install": 1, ":env:": 2}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not sep or section not in rank:
            continue
        value = value.strip().strip("'\"")
        if name not in ranked or rank[section] >= ranked[name][0]:
            ranked[name] = (rank[section], value)
    return {name: value for name, (_, value) in ranked.items()}


def uv_args(config: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for name, flag in FLAGS.items():
        for value in config.get(name, "").split():
            args += [flag, value]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


def main() -> int:
    config = pip_config()
    if sys.argv[1:] == ["--cert"]:
        if config.get("cert"):
            print(config["cert"])
        return 0
    print("\n".join(uv_args(config)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
