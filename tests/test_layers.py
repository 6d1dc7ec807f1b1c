"""Imports run one way: no module imports from a layer above its own (docs/architecture.md, Layers), by any
means: an import statement anywhere in the module, or a module named in a string (an `importlib` call)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "polytrace_cli"
# Lowest first. A module may import its own package and the layers below it; packages side by side in a
# layer know nothing of each other (ingesters know no analyses, analyses know no formats). The first layer
# holds small shared modules, which may import one another. The package root (`polytrace_cli/__init__.py`,
# which hands out `Store`) is the top: nothing imports from it.
LAYERS = [
    {"errors", "jsontext", "display", "lazy", "side_process", "plugins", "schemas", "telemetry", "scratch"},
    {"store"},
    {"semantics"},
    {"ingest", "analyze"},
    {"model", "workload"},
    {"diagnose", "simulate"},
    {"check", "report", "watch"},
    {"facade"},
    {"commands"},
    {"cli"},
    {"__init__"},
]
# A module named in a string: `polytrace_cli.<package>` followed by a dot, a colon or the string's end.
_NAMED_MODULE = re.compile(r"^polytrace_cli\.([a-z_]+)(?:[.:][\w.:]*)?$")


@functools.cache
def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text())


def _layer(name: str) -> int | None:
    return next((index for index, names in enumerate(LAYERS) if name in names), None)


def _imported_tops(tree: ast.AST, package: Path) -> list[tuple[str, str, int]]:
    """(top-level name, what was imported, line) for every reference to a polytrace module in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "polytrace_cli":
                for alias in node.names:
                    is_module = (package / alias.name).is_dir() or (package / f"{alias.name}.py").is_file()
                    if alias.name != "__version__":  # the root's one constant, which needs nothing
                        found.append((alias.name if is_module else "__init__", f"polytrace_cli.{alias.name}",
                                      node.lineno))
            elif node.module.startswith("polytrace_cli."):
                found.append((node.module.split(".")[1], node.module, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("polytrace_cli."):
                    found.append((alias.name.split(".")[1], alias.name, node.lineno))
                elif alias.name == "polytrace_cli":
                    found.append(("__init__", alias.name, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _NAMED_MODULE.match(node.value.strip())
            if match:
                found.append((match.group(1), node.value.strip(), node.lineno))
    return found


def _upward_imports(package: Path = PACKAGE) -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(package.rglob("*.py")):
        top = path.relative_to(package).parts[0].removesuffix(".py")
        own = _layer(top)
        assert own is not None, f"{path.relative_to(package)} is in no layer: add it to LAYERS"
        for name, imported, line in _imported_tops(_tree(path), package):
            target = _layer(name)
            sideways = target == own and name != top and own > 0
            if target is not None and (target > own or sideways):
                found.append((str(path.relative_to(package)), imported, line))
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert _upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    # An analysis that imports the ingest layer inside a function (the leak this guards against).
    (tmp_path / "analyze").mkdir()
    (tmp_path / "analyze" / "stages.py").write_text(
        "def stages(con):\n    from polytrace_cli.ingest import run_metadata\n    return run_metadata\n")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "catalog.py").write_text("from polytrace_cli.store.sql import fetch_first\n")
    assert _upward_imports(tmp_path) == [("analyze/stages.py", "polytrace_cli.ingest", 2)]


def test_the_check_sees_every_other_way_up(tmp_path):
    # A name the package root holds, a plain `import`, and a module named in a string for importlib.
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "__init__.py").write_text("")
    (tmp_path / "store" / "catalog.py").write_text(
        "import importlib\n"
        "from polytrace_cli import NAMES\n"
        "import polytrace_cli.ingest.registry\n"
        "SOURCE = 'polytrace_cli.ingest.registry:declared_metric_names'\n"
        "def names():\n    return importlib.import_module('polytrace_cli.ingest.registry')\n")
    assert _upward_imports(tmp_path) == [
        ("store/catalog.py", "polytrace_cli.NAMES", 2),
        ("store/catalog.py", "polytrace_cli.ingest.registry", 3),
        ("store/catalog.py", "polytrace_cli.ingest.registry:declared_metric_names", 4),
        ("store/catalog.py", "polytrace_cli.ingest.registry", 6),
    ]


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, an import of a name from a package counting as an import
    of the package (its `__init__.py`), of a module as an import of the module."""
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    imported.add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = {target for target in imported if target in modules and target != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_circle_of_files():
    assert _circles(_import_graph()) == []


def test_the_circle_check_sees_two_files_that_import_each_other(tmp_path):
    package = tmp_path / "polytrace_cli"
    (package / "store").mkdir(parents=True)
    (package / "store" / "lake.py").write_text("def f():\n    from polytrace_cli.store.queries import run_ids\n")
    (package / "store" / "queries.py").write_text("from polytrace_cli.store.lake import f\n")
    (package / "store" / "catalog.py").write_text("from polytrace_cli.store.queries import f\n")
    assert _circles(_import_graph(package)) == [["polytrace_cli.store.lake", "polytrace_cli.store.queries"]]
