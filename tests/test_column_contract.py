"""The column contract between the analyses and their consumers.

Each analysis module declares the columns of its frames in `*_COLUMNS` / `*_SCHEMA` dicts. These tests
check that the declarations are true (the functions return exactly those columns) and that every
consumer (report figures, T1, the report's findings, `check`'s thresholds) reads only declared
columns, so a renamed column fails here instead of silently turning a figure into "omitted".
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import polars as pl
import pytest

from conftest import PROJECT_ROOT
from polytrace_cli.analyze.common import RUN_FACTS_COLUMNS
from polytrace_cli.analyze.registry import ANALYSES as BUILT_IN
from polytrace_cli.store import open_store

REPORT = PROJECT_ROOT / "polytrace_cli" / "report"
CONSUMERS = sorted([*REPORT.glob("figures/f*.py"), *REPORT.glob("tables/t*.py"),
                    *(REPORT / name for name in ("findings.py", "help.py") if (REPORT / name).exists())])

# Methods whose string arguments name columns that must exist in the frame.
READING_METHODS = {"select", "sort", "group_by", "unique", "drop", "drop_nulls", "pivot", "unpivot", "join",
                   "col", "get_column", "empty", "over", "partition_by"}
READING_KEYWORDS = {"on", "index", "values", "by", "subset", "maintain_order_by"}
# Methods whose keyword names (and string arguments) create columns.
CREATING_METHODS = {"with_columns", "agg", "select", "with_row_index", "alias", "rename", "unpivot", "DataFrame"}
CREATING_KEYWORDS = {"variable_name", "value_name", "name"}


def declared_schemas(module) -> dict[str, dict]:
    """The module's column declarations: module-level dicts named *_COLUMNS or *_SCHEMA of polars dtypes."""
    out = {}
    for name, value in vars(module).items():
        if (name.endswith("_COLUMNS") or name.endswith("_SCHEMA")) and isinstance(value, dict) and value \
                and all(isinstance(k, str) for k in value) \
                and all(isinstance(v, pl.DataType) or (isinstance(v, type) and issubclass(v, pl.DataType))
                        for v in value.values()):
            out[name] = value
    return out


# The columns of the store's run list (`store.queries.runs_frame`), which T1 starts from.
STORE_RUN_COLUMNS = {"run", "task", "steps", "samples"}


# Analysis modules figures may draw from: the registered analyses and fleet (F12's groups).
DETAIL_MODULES = (*BUILT_IN, "fleet", "semantics", "step_frame")


def analysis_modules() -> dict[str, object]:
    return {name: importlib.import_module(f"polytrace_cli.analyze.{name}") for name in DETAIL_MODULES}


def declared_columns(modules) -> set[str]:
    return {column for module in modules for schema in declared_schemas(module).values() for column in schema}


def _strings(node: ast.AST) -> list[str]:
    """String constants of an argument: itself, or the items of a list/tuple/set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for item in node.elts for s in _strings(item)]
    return []


def columns_read_and_created(source: str) -> tuple[dict[str, int], set[str]]:
    """(column name -> first line read, names the code creates itself) found in a consumer's source."""
    read: dict[str, int] = {}
    created: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in CREATING_METHODS:
                created |= {k.arg for k in node.keywords if k.arg}
                if name in ("alias", "with_row_index"):
                    created |= {s for arg in node.args for s in _strings(arg)}
                if name == "rename":
                    for arg in node.args:
                        if isinstance(arg, ast.Dict):
                            created |= {s for value in arg.values for s in _strings(value)}
                            for key in arg.keys:
                                for s in _strings(key):
                                    read.setdefault(s, node.lineno)
                created |= {s for k in node.keywords if k.arg in CREATING_KEYWORDS for s in _strings(k.value)}
            if name in READING_METHODS:
                args = node.args[1:] if name == "empty" else node.args
                for arg in args:
                    for s in _strings(arg):
                        read.setdefault(s, node.lineno)
                for keyword in node.keywords:
                    if keyword.arg in READING_KEYWORDS:
                        for s in _strings(keyword.value):
                            read.setdefault(s, node.lineno)
        elif isinstance(node, ast.Subscript):
            for s in _strings(node.slice):
                read.setdefault(s, node.lineno)
        elif isinstance(node, ast.Assign):
            # `x, y = "length_tokens", "quantile"`: names bound to strings are column names when read.
            for s in _strings(node.value):
                read.setdefault(s, node.lineno)
    return read, created


def _imported_analyses(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "polytrace_cli.analyze":
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("polytrace_cli.analyze."):
            names.add(node.module.rsplit(".", 1)[1])
    return names & set(DETAIL_MODULES)


@pytest.mark.parametrize("path", CONSUMERS, ids=lambda p: p.name)
def test_consumer_reads_only_declared_columns(path: Path):
    """Every column name a figure or table reads is declared by an analysis module it imports (or is
    one it creates itself, or is a key of its own frames dict)."""
    source = path.read_text()
    modules = analysis_modules()
    imported = _imported_analyses(source)
    assert "detail(" not in source and "first_column(" not in source, "guessing helpers are gone"
    declared = declared_columns(modules[name] for name in imported)
    consumer = importlib.import_module(
        "polytrace_cli." + str(path.relative_to(PROJECT_ROOT / "polytrace_cli")).removesuffix(".py").replace("/", "."))
    frame_keys = set(getattr(consumer, "FRAMES", ()))
    # The keys of the records a consumer itself produces (findings: FINDING_KEYS) are its own declaration.
    frame_keys |= {key for name, value in vars(consumer).items() if name.endswith("_KEYS") for key in value}
    if "runs_frame" in source:
        declared |= STORE_RUN_COLUMNS
    if "run_facts(" in source:
        declared |= set(RUN_FACTS_COLUMNS)
    read, created = columns_read_and_created(source)
    undeclared = {name: line for name, line in read.items()
                  if name not in declared | created | frame_keys and name.isidentifier() and name.islower()}
    assert not undeclared, f"{path.name} reads columns no imported analysis declares: {undeclared}"


def test_the_scanner_catches_a_renamed_column():
    """The scan itself can fail: a frame read of an undeclared name is reported, created names are not."""
    read, created = columns_read_and_created(
        'part = frame.filter(pl.col("slot_idle_share") > 0).with_columns(ratio=pl.col("a") / 2)\n'
        'y = part["ratio"]\nz = part.sort("step")\n')
    assert {"slot_idle_share", "a", "ratio", "step"} <= set(read)
    assert "ratio" in created and "slot_idle_share" not in created
    longtail = importlib.import_module("polytrace_cli.analyze.longtail")
    assert "slot_idle_share" not in declared_columns([longtail])
    assert "slot_idle" in declared_columns([longtail])


def test_check_thresholds_read_declared_summary_columns():
    """Each `check` threshold finds its metric among the columns its analysis' summary declares, and
    every row filter key is declared too."""
    from polytrace_cli import check

    modules = analysis_modules()
    for name, threshold in check.THRESHOLDS.items():
        summary_columns = set()
        for schema_name, schema in declared_schemas(modules[threshold.analysis]).items():
            if schema_name.startswith("SUMMARY"):
                summary_columns |= set(schema)
        assert summary_columns, f"{threshold.analysis} declares no summary columns"
        candidates = getattr(threshold, "columns", None) or (threshold.column,)
        assert any(c in summary_columns for c in candidates), f"{name}: none of {candidates} is declared"
        assert set(getattr(threshold, "where", {})) <= summary_columns, name


def _registered(module_name: str):
    return importlib.import_module(f"polytrace_cli.analyze.{module_name}")


# (analysis, function, declared schema): each detail frame a consumer reads, and every summary.
DETAIL_FRAMES = [
    ("lengths", "per_step", "PER_STEP_COLUMNS"), ("lengths", "cdf", "CDF_COLUMNS"),
    ("lengths", "joint_histogram", "JOINT_HISTOGRAM_COLUMNS"), ("lengths", "correlation", "CORRELATION_COLUMNS"),
    ("lengths", "summary", "SUMMARY_COLUMNS"),
    ("drift", "per_step", "PER_STEP_COLUMNS"), ("drift", "summary", "SUMMARY_SCHEMA"),
    ("longtail", "per_rank", "PER_RANK_COLUMNS"), ("longtail", "per_step", "PER_STEP_COLUMNS"),
    ("longtail", "still_decoding", "STILL_DECODING_COLUMNS"), ("longtail", "summary", "SUMMARY_COLUMNS"),
    ("imbalance", "per_rank", "PER_RANK_COLUMNS"), ("imbalance", "per_step", "PER_STEP_COLUMNS"),
    ("imbalance", "reward_per_rank", "REWARD_PER_RANK_COLUMNS"),
    ("imbalance", "reward_per_step", "REWARD_PER_STEP_COLUMNS"), ("imbalance", "stragglers", "STRAGGLER_COLUMNS"),
    ("imbalance", "summary", "SUMMARY_COLUMNS"),
    ("stages", "per_step", "PER_STEP_COLUMNS"), ("stages", "series", "SERIES_COLUMNS"),
    ("stages", "length_fit", "LENGTH_FIT_COLUMNS"), ("stages", "stage_stats", "STAGE_STATS_COLUMNS"),
    ("stages", "summary", "SUMMARY_COLUMNS"),
    ("stages", "step_time_inclusion", "STEP_TIME_INCLUSION_COLUMNS"),
    ("fleet", "by_group", "BY_GROUP_COLUMNS"),
    ("tools", "latency_cdf", "LATENCY_CDF_COLUMNS"), ("tools", "per_trajectory", "PER_TRAJECTORY_COLUMNS"),
    ("tools", "cache_by_turn", "CACHE_BY_TURN_COLUMNS"), ("tools", "summary", "SUMMARY_COLUMNS"),
    ("filtering", "per_batch", "PER_BATCH_COLUMNS"), ("filtering", "per_trainer_step", "PER_TRAINER_STEP_COLUMNS"),
    ("filtering", "summary", "SUMMARY_COLUMNS"),
]


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    from polytrace_cli.ingest.driver import ingest_paths

    samples = PROJECT_ROOT / "sample_logs"
    if not (samples / "math").exists():
        pytest.skip("sample_logs/ not generated (polytrace demo)")
    con = open_store(tmp_path_factory.mktemp("contract") / "store.duckdb")
    for task in ("math", "code", "search"):
        ingest_paths(con, [samples / task], task=task)
    yield con
    con.close()


@pytest.mark.parametrize(("analysis", "function", "schema"), DETAIL_FRAMES, ids=lambda v: str(v))
def test_declared_columns_are_the_columns_returned(sample_store, analysis, function, schema):
    module = _registered(analysis)
    run_ids = [row[0] for row in sample_store.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
    frame = getattr(module, function)(sample_store, run_ids)
    declared = list(getattr(module, schema))
    if (analysis, function) == ("stages", "per_step"):
        # Stage columns come from the `steps` view (`stages(con)`); the rest are declared.
        declared = module.per_step_columns(sample_store)
        assert [c for c in declared if c not in module.PER_STEP_COLUMNS] == \
            [f"{name}_s" for name in module.stages(sample_store)]
    assert frame.columns == declared, f"{analysis}.{function}"


def test_store_run_columns_t1_reads_exist(sample_store):
    from polytrace_cli.analyze.common import run_facts
    from polytrace_cli.store.queries import runs_frame

    assert STORE_RUN_COLUMNS <= set(runs_frame(sample_store).columns)
    facts = run_facts(sample_store, [row[0] for row in sample_store.execute("SELECT run_id FROM runs").fetchall()])
    assert facts.columns == list(RUN_FACTS_COLUMNS) and facts.height > 0
