"""The packages are floors: each imports only the ones below it (README "Layout").

Read from the source (every import statement, inside functions too), so an import that would turn
an arrow upward, or make a circle, fails here before a reviewer has to find it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

FLOORS = ("trtpipe_runtime", "plugins", "builders", "model_repo", "pipeline")
"""Bottom to top."""
OUTSIDE = ("scripts", "tests")
"""Never imported by the product."""


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _sources(package: str) -> list[Path]:
    # Triton model templates run inside tritonserver's stub, not as part of the package.
    return [p for p in sorted((REPO / package).rglob("*.py")) if "templates" not in p.parts]


@pytest.mark.parametrize("package", FLOORS)
def test_a_package_imports_only_the_floors_below_it(package):
    above = set(FLOORS[FLOORS.index(package) + 1:]) | set(OUTSIDE)
    wrong = {str(p.relative_to(REPO)): sorted(_imports(p) & above) for p in _sources(package)}
    assert not {k: v for k, v in wrong.items() if v}, "imports that run up a floor (see README 'Layout')"


def test_templates_import_only_the_support_package():
    """The Python-backend models import the one package copied beside them (trtpipe_runtime), nothing else of
    the product: a repository holds no other of its code."""
    templates = sorted((REPO / "model_repo" / "templates").rglob("*.py"))
    assert templates
    wrong = {str(p.relative_to(REPO)): sorted(_imports(p) & set(FLOORS[1:] + OUTSIDE)) for p in templates}
    assert not {k: v for k, v in wrong.items() if v}
