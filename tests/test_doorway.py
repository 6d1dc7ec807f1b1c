"""One doorway: every command that reads or writes a store does it through `Store` (polytrace_cli/facade.py),
as a notebook does, so the command line and notebooks cannot drift apart."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import typer.main

from polytrace_cli.cli import COMMANDS, app

COMMANDS_DIR = Path(__file__).resolve().parents[1] / "polytrace_cli" / "commands"
# None: `Store.error_message` words DuckDB's errors about the store file itself (locks, damage, a full disk).
ALLOWED_STORE_IMPORTS: set[tuple[str, str]] = set()


def test_no_command_opens_or_queries_the_store_itself():
    found = []
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "open_store":
                found.append((path.name, "open_store", node.lineno))
            if (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("polytrace_cli.store")
                    and (path.name, node.module) not in ALLOWED_STORE_IMPORTS):
                found.append((path.name, node.module, node.lineno))
    assert found == []


def _called_source(function) -> str:
    """The function's source and that of the module-level helpers it calls (one level)."""
    module = sys.modules[function.__module__]
    source = inspect.getsource(function)
    called = {node.func.id for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    helpers = [getattr(module, name) for name in called if callable(getattr(module, name, None))
               and getattr(getattr(module, name), "__module__", None) == module.__name__]
    return source + "".join(_called_source_once(helper) for helper in helpers)


def _called_source_once(helper) -> str:
    try:
        return _called_source(helper)
    except (OSError, TypeError):
        return ""


def test_every_command_with_a_store_goes_through_store():
    with_db = [name for name in COMMANDS
               if any("--db" in (p.opts or []) for p in typer.main.get_command(app).commands[name].params)]
    assert len(with_db) >= 15
    missing = [name for name in with_db if "Store." not in _called_source(inspect.unwrap(COMMANDS[name]))]
    assert missing == []
