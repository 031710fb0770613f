"""Where a build's outputs live: ``<project root>/build/<name>/<target>[-<variant>]/``.

One place for the rule, used by the build, the deploy stage, the server launcher and the load
tester. The project root is :func:`plugins.fsutil.project_root` (``$TRTPIPE_HOME`` or the current
directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from builders.spec import ResolvedBuild, load_spec, overrides_from_flags
from plugins.fsutil import project_root


def build_root() -> Path:
    """``<project root>/build``: the default parent of every build folder."""
    return project_root() / "build"


def build_dir(build: ResolvedBuild, root: Optional[Path] = None, variant: Optional[str] = None) -> Path:
    """``<root>/<name>/<target>[-<variant>]``: where a build's outputs live (``root`` default :func:`build_root`)."""
    leaf = build.target if not variant else f"{build.target}-{variant}"
    return Path(root or build_root()) / build.name / leaf


def resolve_build(spec_path: str | Path, target: str, quant: Optional[str] = None,
                  runtime: Optional[str] = None) -> ResolvedBuild:
    """Load ``spec_path`` for ``target`` with the ``--quant`` / ``--runtime`` overrides applied (raise SpecError)."""
    return load_spec(spec_path, target, overrides_from_flags(quant, runtime))


def variant(quant: Optional[str] = None, runtime: Optional[str] = None, spec_path: str | Path | None = None,
            target: Optional[str] = None) -> Optional[str]:
    """The build-folder suffix of the CLI overrides: ``<quant>``, ``<runtime>`` or ``<quant>-<runtime>`` (None: none).
    With ``spec_path`` and ``target``, an override equal to what the build file already says for that target adds
    nothing (``TARGET=h200 RUNTIME=trtllm-llmapi`` on a target that is trtllm-llmapi builds the plain folder)."""
    if spec_path is not None and target is not None and (quant or runtime):
        plain = load_spec(spec_path, target).settings
        quant = None if quant == plain.quantization.quant_algo else quant
        runtime = None if runtime == plain.runtime else runtime
    return "-".join(v for v in (quant, runtime) if v) or None
