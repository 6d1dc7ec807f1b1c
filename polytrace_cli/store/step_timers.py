"""Which timers a run's step time counts, read from the run's step facts (`store.step_facts`), or
from its pairs and the metric aliases where the facts cannot be kept (a read-only store).

verl counts its testing and checkpoint timers inside `timing_s/step` in some versions and not in
others. Ingest records the answer in run meta when it can tell; analyses and the model ask again from
the numbers for a run ingested without it.
"""

from __future__ import annotations

import duckdb

from polytrace_cli.store import step_facts
from polytrace_cli.store.catalog import installed_fingerprint

# Timers that verl may or may not count inside `timing_s/step`, depending on its version, and the
# run meta key recording which way a run logged them.
EXTRA_TIMERS = {"testing": "step_time_includes_testing", "save_checkpoint": "step_time_includes_checkpoint"}
_NOT_STAGES = {"step_s", *(f"{timer}_s" for timer in EXTRA_TIMERS)}
# Meta keys whose null is an answer ("cannot tell", from `step_time_inclusion`), kept in runs.meta.
NULL_MEANS_CANNOT_TELL = frozenset(EXTRA_TIMERS.values())
# Share of the voting steps that must agree before a run is decided.
INCLUSION_AGREEMENT = 0.8


# The stage columns of each generated `steps` view, by the fingerprint it was generated from.
_STAGES_OF_VIEW: dict[str, list[str]] = {}


def stage_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The stage columns of the `steps` view, in its order: its `*_s` columns other than step_s,
    testing_s and save_checkpoint_s (the view's column list is the one source of them). A view the
    catalog generated is described once per fingerprint (`catalog.installed_fingerprint`)."""
    fingerprint = installed_fingerprint(con)
    if fingerprint in _STAGES_OF_VIEW:
        return list(_STAGES_OF_VIEW[fingerprint])
    columns = [row[0] for row in con.execute("DESCRIBE steps").fetchall()]
    stages = [column for column in columns if column.endswith("_s") and column not in _NOT_STAGES]
    if fingerprint is not None:
        _STAGES_OF_VIEW[fingerprint] = stages
    return list(stages)


def decision_columns(con: duckdb.DuckDBPyConnection) -> tuple[list[str], list[str]]:
    """(the stage columns (`stage_columns`), every `steps` column the decisions over a whole run read
    (`step_time_inclusion`, the semantics record): step_s, the stages, testing_s, save_checkpoint_s,
    the tokens and the mean lengths); asked for together, the run's steps are read once for all of
    them (`step_facts.run_steps_table`)."""
    stages = stage_columns(con)
    return stages, ["step_s", *stages, *(f"{timer}_s" for timer in EXTRA_TIMERS), "total_tokens",
                    "prompt_length_mean", "response_length_mean"]


def step_time_inclusion(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """Whether a run's step time includes its testing and checkpoint timers, from its numbers.

    For each extra timer X: residual = step_s − Σ stages on the steps with a step time;
    baseline b = median residual over steps without either extra timer (0 when there are none),
    spread = their interquartile range. A step with X > 0 (and not the other extra timer, when such
    steps exist) votes 'included' when residual > b + X/2 (nearer b + X than b), provided X is
    larger than twice the spread; else it abstains. The run is decided when at least 80% of the
    voters agree; otherwise (or with no voter) the answer is None: cannot tell.

    Returns {'step_time_includes_testing': bool | None, 'step_time_includes_checkpoint': ...}.
    """
    stages, columns = decision_columns(con)
    stage_sum = " + ".join(f"coalesce({column}, 0)" for column in stages) or "0"
    wanted = [*stages, "step_s", *(f"{timer}_s" for timer in EXTRA_TIMERS)]
    table = step_facts.run_steps_table(con, run_id, columns)
    if table:
        timers, arguments = f"SELECT * FROM {table}", []
    else:  # From step_metrics rather than the `steps` view: only the timer keys of this run are pivoted.
        timers = f"""
            PIVOT (SELECT sm.segment, sm.step, a.canonical, sm.value
                   FROM step_metrics sm JOIN metric_aliases a ON a.key = sm.key
                   WHERE sm.run_id = $1 AND a.canonical IN (SELECT unnest($2)))
            ON canonical IN ({", ".join(f"'{column}'" for column in wanted)})
            USING max(value) GROUP BY segment, step"""
        arguments = [run_id, wanted]
    # Three lists in step order rather than a row per step: no tuple per step for the interpreter's
    # garbage collector to walk.
    lists = con.execute(
        f"""
        WITH timers AS ({timers})
        SELECT list(step_s - ({stage_sum}) ORDER BY segment, step), list(coalesce(testing_s, 0) ORDER BY segment, step),
               list(coalesce(save_checkpoint_s, 0) ORDER BY segment, step)
        FROM timers WHERE step_s IS NOT NULL
        """,
        arguments,
    ).fetchall()[0]
    residuals, testing, checkpoint = (values or [] for values in lists)
    baseline = sorted(residual for residual, test, save in zip(residuals, testing, checkpoint) if test <= 0 and save <= 0)
    centre = _quantile(baseline, 0.5) if baseline else 0.0
    spread = _quantile(baseline, 0.75) - _quantile(baseline, 0.25) if baseline else 0.0
    decided: dict = {}
    for meta_key, seconds_of, other_of in ((EXTRA_TIMERS["testing"], testing, checkpoint),
                                           (EXTRA_TIMERS["save_checkpoint"], checkpoint, testing)):
        with_timer = [(residual, seconds, other) for residual, seconds, other in zip(residuals, seconds_of, other_of)
                      if seconds > 0]
        alone = [row for row in with_timer if row[2] <= 0] or with_timer
        votes = [residual > centre + seconds / 2 for residual, seconds, _ in alone if seconds > 2 * spread]
        decided[meta_key] = None
        if votes:
            share = sum(votes) / len(votes)
            if share >= INCLUSION_AGREEMENT:
                decided[meta_key] = True
            elif share <= 1 - INCLUSION_AGREEMENT:
                decided[meta_key] = False
    return decided


def _quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending list."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
