"""The environment trtpipe's processes start with: set by the entry points (the CLI's ``main``, the test session,
the benchmark scripts) before torch is imported, and given to the servers they start."""

from __future__ import annotations

import os
from typing import MutableMapping


def passive_openmp(environ: MutableMapping[str, str] = os.environ) -> MutableMapping[str, str]:
    """``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` unless it is set (idle OpenMP threads of torch's CPU build spin
    and take the cores from the work: docs/benchmarks/reliability.md); before the first torch import."""
    environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return environ
