"""polytrace: characterize RLVR training runs from the logs RL frameworks write.

`from polytrace_cli import Store` gives the Python interface (see `polytrace_cli.facade`). Importing
the package loads nothing heavy: the command line starts from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Store", "__version__"]

if TYPE_CHECKING:
    from polytrace_cli.facade import Store

def __getattr__(name: str):
    if name == "Store":
        from polytrace_cli.facade import Store

        return Store
    raise AttributeError(f"module 'polytrace_cli' has no attribute {name!r}")
