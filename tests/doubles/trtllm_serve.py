#!/usr/bin/env python3
"""Test double for TensorRT-LLM 1.2.1's ``trtllm-serve serve MODEL``.

It accepts exactly the options (names, aliases, value types, choices) that ``trtllm-serve serve`` 1.2.1 takes and
refuses anything else the way the real one, a click command, does: ``Error: No such option: --x`` (or a bad value,
a missing MODEL, another subcommand) on stderr, exit status 2. The parser is built from ``trtllm_serve.options`` of
tests/facts/trtllm_1_2_1/llm_args.json (recorded from ``tensorrt_llm/commands/serve.py``), so the double and the
facts cannot drift apart; an option only 1.4 has is refused.

Then, as the real one: the ``--config`` YAML is loaded with ``yaml.safe_load`` and must be a mapping whose keys are
``TorchLlmArgs`` fields (``torch_llm_args`` of the same facts; the class forbids extra keys, so an unknown one is
pydantic's ``Extra inputs are not permitted``); MODEL must be a folder with config.json; nothing listens until the
model is "loaded"; then ``GET /health`` answers 200 (``trtllm_serve.health_path``) and ``GET /v1/models`` lists MODEL.
SIGTERM ends it.

Environment knobs for tests: TRTPIPE_SERVE_DOUBLE_DIE (a message: printed to stderr after the start-up lines, then
exit 1), TRTPIPE_SERVE_DOUBLE_DELAY (seconds of "loading" before it listens), TRTPIPE_SERVE_DOUBLE_ARGV (file that
receives the argv as JSON).

:func:`install` puts an executable called ``trtllm-serve`` that runs this file into a folder, for tests to put on
PATH (the product finds ``trtllm-serve`` with ``shutil.which``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FACTS = Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "llm_args.json"


class UsageError(Exception):
    """What click reports as ``Error: ...`` with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # click's wording for the cases the tests meet, not argparse's
        m = re.match(r"unrecognized arguments: (\S+)", message)
        raise UsageError(f"No such option: {m.group(1)}" if m and m.group(1).startswith("-") else message)


def _value_type(spec: str):
    """The argparse type for a facts type string ('int', 'float', "Choice['a','b'] (alias x->b)", 'str', ...)."""
    if spec.startswith("Choice["):
        choices = re.findall(r"'([^']+)'", spec.split("]")[0])
        aliases = dict(re.findall(r"(\w+)->(\w+)", spec))

        def choice(value):
            if value not in choices and value not in aliases:
                raise argparse.ArgumentTypeError(f"'{value}' is not one of {', '.join(map(repr, choices))}.")
            return aliases.get(value, value)
        return choice
    return {"int": int, "float": float}.get(spec.split()[0], str)


def parser() -> argparse.ArgumentParser:
    facts = json.loads(FACTS.read_text())["trtllm_serve"]
    p = _Parser(prog="trtllm-serve serve", add_help=False, allow_abbrev=False)  # click takes no abbreviations
    p.add_argument("model")
    for flag, f in facts["options"].items():
        names = [flag, *f.get("aliases", [])]
        dest = f.get("dest") or flag.lstrip("-").replace("-", "_")
        if f["type"].startswith("flag"):
            p.add_argument(*names, dest=dest, action="store_true")
        elif "(multiple)" in f["type"]:
            p.add_argument(*names, dest=dest, action="append", type=_value_type(f["type"]))
        else:
            p.add_argument(*names, dest=dest, type=_value_type(f["type"]), default=f.get("default"))
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """``serve MODEL [options]``; raises UsageError for anything 1.2.1's serve command would refuse."""
    if not argv or argv[0] != "serve":
        raise UsageError(f"this double covers `serve` only, not {argv[0]!r}" if argv else "Missing command.")
    return parser().parse_args(argv[1:])


def _options(path: str | None) -> dict:
    if path is None:
        return {}
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the options YAML must be a mapping, got {type(data).__name__}")
    fields = set(json.loads(FACTS.read_text())["torch_llm_args"])
    extra = [k for k in data if k not in fields]
    if extra:  # pydantic v2's report for a model with extra='forbid'
        raise ValueError(f"{len(extra)} validation error{'s' if len(extra) > 1 else ''} for TorchLlmArgs\n"
                         + "\n".join(f"{k}\n  Extra inputs are not permitted [type=extra_forbidden]" for k in extra))
    return data


def _handler(model: str):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}).encode())
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def _send(self, status: int, body: bytes):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            print(f'INFO:     {self.client_address[0]} - "{self.requestline}" {args[1]}', flush=True)
    return Handler


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if os.environ.get("TRTPIPE_SERVE_DOUBLE_ARGV"):
        Path(os.environ["TRTPIPE_SERVE_DOUBLE_ARGV"]).write_text(json.dumps(argv))
    try:
        args = parse(argv)
    except UsageError as exc:
        print(f"Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\nError: {exc}",
              file=sys.stderr)
        return 2
    print("[TensorRT-LLM] TensorRT-LLM version: 1.2.1", flush=True)
    try:
        options = _options(args.extra_llm_api_options)
        if not (Path(args.model) / "config.json").is_file():
            raise OSError(f"{args.model} does not appear to have a file named config.json")
    except (OSError, ValueError) as exc:
        print(f"Traceback (most recent call last):\n  ...\n{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"[TRT-LLM] [I] LLM args: tensor_parallel_size={options.get('tensor_parallel_size', 1)} "
          f"max_batch_size={options.get('max_batch_size')}", flush=True)
    if os.environ.get("TRTPIPE_SERVE_DOUBLE_DIE"):
        print(os.environ["TRTPIPE_SERVE_DOUBLE_DIE"], file=sys.stderr, flush=True)
        return 1
    time.sleep(float(os.environ.get("TRTPIPE_SERVE_DOUBLE_DELAY", "0")))  # loading the model: nothing listens
    try:
        server = ThreadingHTTPServer((args.host, args.port), _handler(args.model))
    except OSError as exc:  # uvicorn's wording
        print(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('{args.host}', {args.port}): "
              f"{exc.strerror.lower()}", file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("INFO:     Shutting down", flush=True)
    finally:
        server.server_close()
    return 0


def install(bin_dir: Path) -> Path:
    """Write ``bin_dir/trtllm-serve``, an executable that runs this double with this interpreter; return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "trtllm-serve"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    exe.chmod(0o755)
    return exe


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
