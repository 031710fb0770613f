"""The sys.path set-up every served model runs first, before ``triton_python_backend_utils`` (which imports numpy).

The Python-backend stub ignores PYTHONPATH: the launcher passes TRTPIPE_PYTHONPATH (``pipeline.serve``) and the
generator writes the same list to ``<model>/sys_path.json`` beside config.pbtxt (``model_repo.generate``); the
GPU-host bundle empties it, the image's packages serving instead. numpy<2 must come first.
"""

from __future__ import annotations

import json
import os
import sys


def set_up_sys_path(model_file: str) -> list[str]:
    """Put the version folder of the model whose ``<model>/1/<file>.py`` is ``model_file`` first on sys.path (its
    modules and its copy of this package win), then its site-packages folders (TRTPIPE_PYTHONPATH, else
    ``<model>/sys_path.json``), and make the modules named in TRTPIPE_STUB_BLOCK_MODULES look absent. Also turns
    on :mod:`faulthandler`: a stub that dies of a signal (SIGSEGV, SIGABRT, ...) writes every thread's Python stack
    to its stderr, which tritonserver's log keeps (else the stub vanishes and Triton only says "not healthy").
    Returns the folders put first, first first."""
    import faulthandler

    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    entries = [p for p in os.environ.get("TRTPIPE_PYTHONPATH", "").split(os.pathsep) if p]
    if not entries:
        f = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(model_file))), "sys_path.json")
        if os.path.exists(f):
            with open(f) as fh:
                entries = json.load(fh)
    entries = [os.path.dirname(os.path.abspath(model_file))] + entries
    for p in reversed(entries):
        if p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    # Packages compiled against numpy 2 (scikit-learn on a numpy-2 image) break under the stub's numpy<2, and
    # transformers imports scikit-learn whenever it is installed: find_spec returns None for a name set to None.
    for name in [n for n in os.environ.get("TRTPIPE_STUB_BLOCK_MODULES", "").split(",") if n]:
        sys.modules.setdefault(name, None)
    return entries
