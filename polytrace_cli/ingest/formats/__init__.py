"""Built-in input formats: a folder per framework or tracker, holding its metric names (`names.py`) and one
module per format.

Importing this package loads no format: a framework's `names.py` is read at every store open and must stay
cheap. `load_builtin_formats` imports the format modules, which register their ingesters as they load, in
sniffing order (the first format whose sniff accepts a file reads it). A file read with a named format
(`--format`) needs that format's module alone (`load_builtin_format`, through `FORMAT_MODULES`).
"""

import functools
import importlib
from pathlib import Path

# Specific formats first (a PolyTrace trace recognised by its file name), general ones last (verl's console
# log: any text log with `step:N - key:value` lines). A module of a framework folder named in neither list
# (a new framework's format) is sniffed between them, in name order. The order holds whichever module is
# imported first (`sniffing.all_ingesters` sorts by it).
SPECIFIC_FIRST = (
    "polytrace.packed", "polytrace.reward", "polytrace.dapo", "polytrace.multiturn", "polytrace.dataset",
    "verl.jsonl", "verl.rollout", "openrlhf.console", "trl.console", "tensorboard.events", "trl.trainer_state",
    "wandb.run_files", "mlflow.store", "wandb.offline", "wandb.table", "wandb.csv_export",
)
# A Chrome trace is JSON any profiler may write: after the readers of named layouts (Kineto, Nsight, AReaL).
GENERAL_LAST = ("traces.chrome_json", "verl.console")
# Modules of a framework folder that hold no format.
NOT_FORMATS = ("__init__", "names")


# The module of each built-in format, by format name: `--format NAME` imports that module alone instead of every
# format (40 modules, numpy and the trace readers among their imports). A format missing here is still found
# (every module is loaded then); `tests/test_framework_folder.py` checks the table against the registry.
FORMAT_MODULES = {
    "polytrace-packed": "polytrace.packed", "polytrace-reward": "polytrace.reward",
    "polytrace-dapo-filter": "polytrace.dapo", "polytrace-multiturn": "polytrace.multiturn",
    "polytrace-dataset": "polytrace.dataset", "verl-jsonl": "verl.jsonl", "verl-rollout": "verl.rollout",
    "openrlhf-console": "openrlhf.console", "trl-console": "trl.console", "tensorboard-events": "tensorboard.events",
    "trl-trainer-state": "trl.trainer_state", "wandb-config": "wandb.run_files", "wandb-summary": "wandb.run_files",
    "mlflow-metric": "mlflow.store", "mlflow-run-file": "mlflow.store", "mlflow-sqlite": "mlflow.store",
    "wandb-offline": "wandb.offline", "wandb-table": "wandb.table", "wandb-csv": "wandb.csv_export",
    "areal-console": "areal.console", "areal-traces": "areal.traces", "areal-sessions": "areal.traces",
    "clearml-metrics": "clearml.session", "clearml-task": "clearml.session", "clearml-log": "clearml.session",
    "nemo-rl-console": "nemo_rl.console", "nemo-rl-trace": "nemo_rl.workload_trace",
    "prometheus-range": "prometheus.range_query", "prometheus-scrape": "prometheus.scrape",
    "roll-console": "roll.console", "skyrl-console": "skyrl.console", "slime-console": "slime.console",
    "swanlab-config": "swanlab.config", "swanlab-records": "swanlab.records", "pytorch-profiler": "traces.kineto",
    "nsys-sqlite": "traces.nsys", "trackio-sqlite": "trackio.project", "chrome-trace": "traces.chrome_json",
    "chrome-trace-jsonl": "traces.chrome_json", "verl-console": "verl.console",
}


@functools.cache
def format_modules() -> tuple[str, ...]:
    """Every built-in format module as `<framework>.<module>`, in sniffing order: SPECIFIC_FIRST, then the
    other modules of the framework folders by name, then GENERAL_LAST."""
    folder = Path(__file__).parent
    found = {f"{path.parent.name}.{path.stem}" for path in folder.glob("*/*.py") if path.stem not in NOT_FORMATS}
    listed = {*SPECIFIC_FIRST, *GENERAL_LAST}
    return (*SPECIFIC_FIRST, *sorted(found - listed), *GENERAL_LAST)


@functools.cache
def load_builtin_formats() -> None:
    """Import every built-in format module (`format_modules`), registering their ingesters; once."""
    for module in format_modules():
        importlib.import_module(f"{__name__}.{module}")


def load_builtin_format(name: str) -> bool:
    """Import the module of the built-in format `name` (`FORMAT_MODULES`), registering its ingesters; False
    when no built-in format is listed so (a plugin's format, or none)."""
    module = FORMAT_MODULES.get(name)
    if module is None:
        return False
    importlib.import_module(f"{__name__}.{module}")
    return True
