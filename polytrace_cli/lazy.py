"""polars, loaded on first use.

The ingesters of text logs use polars; the ingesters of PolyTrace traces do not. Every ingester is
imported up front (the registry sniffs files with all of them), so the text-log modules take polars
from here: the import happens when one of them first touches it. `benchmarks/cli_start.py` measures
what that saves a one-line trace ingest: about 140 ms of CPU (results in benchmarks/results.md).
Elsewhere a function-local import does the same job more plainly.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """Module `name`, executed on its first attribute access (the loaded module when it already is)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


polars = lazy_module("polars")
