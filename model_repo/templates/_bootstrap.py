# --- sys.path bootstrap: must run before triton_python_backend_utils (which imports numpy).
# The Python-backend stub ignores PYTHONPATH; the launcher passes TRTPIPE_PYTHONPATH, and the
# generator writes the same list to sys_path.json beside config.pbtxt. numpy<2 must come first.
import json as _json
import os as _os
import sys as _sys


def _bootstrap_sys_path():
    entries = [p for p in _os.environ.get("TRTPIPE_PYTHONPATH", "").split(_os.pathsep) if p]
    if not entries:
        f = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "sys_path.json")
        if _os.path.exists(f):
            with open(f) as fh:
                entries = _json.load(fh)
    for p in reversed(entries):
        if p in _sys.path:
            _sys.path.remove(p)
        _sys.path.insert(0, p)


_bootstrap_sys_path()
# Packages compiled against numpy 2 (scikit-learn on a numpy-2 image) break under the stub's
# numpy<2, and transformers imports scikit-learn whenever it is installed. Names listed in
# TRTPIPE_STUB_BLOCK_MODULES are made to look absent (find_spec returns None for them).
for _name in [n for n in _os.environ.get("TRTPIPE_STUB_BLOCK_MODULES", "").split(",") if n]:
    _sys.modules.setdefault(_name, None)
# --- end of bootstrap
