"""The Triton model templates' own modules, imported the way the Python-backend stub imports them.

The stub imports ``<model>/1/model.py`` with that folder importable, so a template's modules import each other
(``import sampling``) and the support package (``import trtpipe_runtime``, here the checkout's) by name.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from model_repo.generate import TEMPLATES


def template_module(template: str, name: str = "model"):
    """``templates/<template>/1/<name>.py`` as a module, its folder first on sys.path. ``model`` (a name every
    template has) is loaded under ``<template>_model``; the others under their own name, once per process."""
    folder = str(TEMPLATES / template / "1")
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    if name != "model":
        return importlib.import_module(name)
    sys.modules.pop("trtpipe_runtime.triton_io", None)  # binds the triton_python_backend_utils of this import
    spec = importlib.util.spec_from_file_location(f"{template}_model", f"{folder}/model.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
