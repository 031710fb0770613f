"""What the stages ask, the ground floor: the registries (``recipes``, ``runtimes``, ``architectures``,
``targets``), the trtllm-build plugin resolver and SM gates (``resolve``), and ``errors`` / ``fsutil``.
Imports nothing of the other packages.

Importing it sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment says otherwise (every trtpipe process imports
this package before torch, and the processes it starts inherit it). torch's CPU build runs on GNU OpenMP, whose
idle threads spin between parallel regions by default: on 2 cores they take the core from the Python thread that
drives ModelOpt's AWQ search, and beside another job each region waits for a descheduled spinner. Measured on the
default build's AWQ calibration (docs/benchmarks/reliability.md): 73 s -> 52 s idle, 196 s -> 89 s beside one
other 2-core job. It must be set before the OpenMP runtime starts (the first torch import).
"""

import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
