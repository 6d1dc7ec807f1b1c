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

# The store generates its `steps` view from the formats' metric names, which the ingest layer (above the
# store) declares: this names the function that returns them, so that no module imports a layer above
# its own (store/catalog.py calls it).
METRIC_NAMES_SOURCE = "polytrace_cli.ingest.registry:declared_metric_names"
# The same for the key families that tell a run's execution mode (semantics/execution_mode.py calls it).
EXECUTION_MODE_SOURCE = "polytrace_cli.ingest.registry:declared_execution_mode_keys"


def __getattr__(name: str):
    if name == "Store":
        from polytrace_cli.facade import Store

        return Store
    raise AttributeError(f"module 'polytrace_cli' has no attribute {name!r}")
