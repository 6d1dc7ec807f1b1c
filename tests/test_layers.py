"""Imports run one way: no module imports from a layer above its own (docs/architecture.md, Layers)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "polytrace_cli"
# Lowest first. A module may import its own package and the layers below it; packages side by side in a
# layer know nothing of each other (ingesters know no analyses, analyses know no formats). The first layer
# holds small shared modules, which may import one another.
LAYERS = [
    {"errors", "jsontext", "display", "lazy", "side_process", "plugins", "schemas", "telemetry"},
    {"store"},
    {"semantics"},
    {"ingest", "analyze"},
    {"model", "workload"},
    {"diagnose", "simulate"},
    {"check", "report", "watch"},
    {"facade"},
    {"commands"},
    {"cli"},
]


def _layer(name: str) -> int | None:
    return next((index for index, names in enumerate(LAYERS) if name in names), None)


def _upward_imports(package: Path = PACKAGE) -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        top = path.relative_to(package).parts[0].removesuffix(".py")
        if top == "__init__":  # the package root hands out `Store` lazily
            continue
        own = _layer(top)
        assert own is not None, f"{path.relative_to(package)} is in no layer: add it to LAYERS"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("polytrace_cli."):
                name = node.module.split(".")[1]
                target = _layer(name)
                sideways = target == own and name != top and own > 0
                if target is not None and (target > own or sideways):
                    found.append((str(path.relative_to(package)), node.module, node.lineno))
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert _upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    # An analysis that imports the ingest layer inside a function (the leak this guards against).
    (tmp_path / "analyze").mkdir()
    (tmp_path / "analyze" / "stages.py").write_text(
        "def stages(con):\n    from polytrace_cli.ingest import run_metadata\n    return run_metadata\n")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "catalog.py").write_text("from polytrace_cli.store.connection import fetch_first\n")
    assert _upward_imports(tmp_path) == [("analyze/stages.py", "polytrace_cli.ingest", 2)]
