"""What each canonical stage means in each framework, as the frameworks' names modules declare it.

A framework's names module (`ingest/<framework>_names.py` or `ingest/formats/<framework>/names.py`)
may set `FRAMEWORK` (the `runs.framework` value) and `STAGE_MEANINGS` ({`steps` column: what that
framework's number holds}). A stage it leaves out has no counterpart in it: comparing that stage
across frameworks compares a number with nothing.
"""

from __future__ import annotations

from polytrace_cli.ingest.registry import metric_name_modules, names_module

NO_COUNTERPART = "no counterpart"


def stage_meanings() -> dict[str, dict[str, str]]:
    """{framework: {stage column: meaning}} of every names module that declares them."""
    found: dict[str, dict[str, str]] = {}
    for name in metric_name_modules():
        module = names_module(name)
        framework, meanings = getattr(module, "FRAMEWORK", None), getattr(module, "STAGE_MEANINGS", None)
        if framework and meanings:
            found.setdefault(framework, {}).update(meanings)
    return found


def stages_across(frameworks: list[str | None], stage_columns: list[str]) -> list[tuple[str, list[str]]]:
    """For runs of these frameworks (in order), each stage of `stage_columns` that some framework
    declares: (stage, one text per run: its meaning there, `no counterpart`, or that the run's
    framework is unknown or declares no stages)."""
    declared = stage_meanings()
    rows = []
    for stage in stage_columns:
        if not any(stage in declared.get(framework or "", {}) for framework in frameworks):
            continue
        texts = []
        for framework in frameworks:
            if framework not in declared:
                texts.append(f"framework {framework or 'unknown'}: stages not declared")
            else:
                texts.append(declared[framework].get(stage, NO_COUNTERPART))
        rows.append((stage, texts))
    return rows


def stage_meanings_frame(con, run_ids: list[int]):
    """One row per canonical stage (the `steps` view's `*_s` columns) that a framework of the runs
    declares: `stage`, then one column per run (named after it) saying what the stage holds in that
    run's framework, or `no counterpart`. No rows when no run's framework declares its stages."""
    import polars as pl

    from polytrace_cli.store.catalog import STEP_COLUMNS

    if not run_ids:
        return pl.DataFrame(schema={"stage": pl.String})
    found = dict(con.execute("SELECT run_id, name || chr(0) || coalesce(framework, '') FROM runs"
                             " WHERE list_contains(?, run_id)", [run_ids]).fetchall())
    names, frameworks = zip(*(found[run_id].split("\0") for run_id in run_ids))
    rows = stages_across([framework or None for framework in frameworks],
                         [column for column in STEP_COLUMNS if column.endswith("_s")])
    schema = {"stage": pl.String, **{name: pl.String for name in names}}
    return pl.DataFrame([(stage, *texts) for stage, texts in rows], schema=schema, orient="row")
