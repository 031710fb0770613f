"""``trtpipe build`` in a child process with the trtllm-build test double injected.

For tests that must kill a build mid-stage: ``python -m tests.doubles.run_build SPEC TARGET OUT``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from builders.spec import load_spec
from pipeline.build import run_build
from tests.doubles.trtllm_build import toolchain


def main(argv: list[str]) -> int:
    spec, target, out = argv
    logging.basicConfig(level=logging.INFO, format="[trtpipe] %(message)s", stream=sys.stderr)
    run_build(load_spec(spec, target), out_root=Path(out), progress=False, toolchain=toolchain())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
