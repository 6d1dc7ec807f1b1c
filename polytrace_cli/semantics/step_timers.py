"""Which timers a run's step time counts, read from the run's step facts (`semantics.step_facts`), or
from its pairs and the metric aliases where the facts cannot be kept (a read-only store).

verl counts its testing and checkpoint timers inside `timing_s/step` in some versions and not in
others. Ingest records the answer in run meta when it can tell; analyses and the model ask again from
the numbers for a run ingested without it.
"""

from __future__ import annotations

import duckdb

from polytrace_cli.semantics import step_facts
from polytrace_cli.store.catalog import installed_fingerprint

# Timers that verl may or may not count inside `timing_s/step`, depending on its version, and the
# run meta key recording which way a run logged them.
EXTRA_TIMERS = {"testing": "step_time_includes_testing", "save_checkpoint": "step_time_includes_checkpoint"}
# `rollout_s` is the rollout side's busy time in an asynchronous run: it runs beside the trainer's step,
# so it is no part of the step's sum of timers.
PARALLEL_TIMERS = ("rollout_s",)
_NOT_STAGES = {"step_s", *(f"{timer}_s" for timer in EXTRA_TIMERS), *PARALLEL_TIMERS}
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
    decided: dict = dict.fromkeys(EXTRA_TIMERS.values())
    if table:
        timed = con.execute(f"SELECT count(*) FILTER (WHERE step_s IS NOT NULL AND (testing_s > 0 OR"
                            f" save_checkpoint_s > 0)) FROM {table}").fetchall()[0][0]
        if not timed:
            return decided  # no step can vote (the rule's query, which DuckDB takes ~10 ms to plan, says so too)
        timers, arguments = f"SELECT * FROM {table}", []
    else:  # From step_metrics rather than the `steps` view: only the timer keys of this run are pivoted.
        timers = f"""
            PIVOT (SELECT segment, step, canonical, value FROM named_step_metrics
                   WHERE run_id = $1 AND canonical IN (SELECT unnest($2)))
            ON canonical IN ({", ".join(f"'{column}'" for column in wanted)})
            USING max(value) GROUP BY segment, step"""
        arguments = [run_id, wanted]
    # The rule in one query: the run's steps never come to Python (it ran on every growth of a watched log).
    rows = con.execute(
        f"""
        WITH timers AS ({timers}),
        t AS (SELECT step_s - ({stage_sum}) AS residual, coalesce(testing_s, 0) AS testing,
                     coalesce(save_checkpoint_s, 0) AS save_checkpoint
              FROM timers WHERE step_s IS NOT NULL),
        base AS (SELECT coalesce(quantile_cont(residual, 0.5), 0) AS centre,
                        coalesce(quantile_cont(residual, 0.75) - quantile_cont(residual, 0.25), 0) AS spread
                 FROM t WHERE testing <= 0 AND save_checkpoint <= 0),
        with_timer AS (SELECT 'testing' AS timer, residual, testing AS seconds, save_checkpoint AS other
                       FROM t WHERE testing > 0
                       UNION ALL
                       SELECT 'save_checkpoint', residual, save_checkpoint, testing FROM t WHERE save_checkpoint > 0),
        voters AS (SELECT *, bool_or(other <= 0) OVER (PARTITION BY timer) AS some_alone FROM with_timer)
        SELECT timer, count(*) FILTER (WHERE residual > centre + seconds / 2), count(*)
        FROM voters, base WHERE (other <= 0 OR NOT some_alone) AND seconds > 2 * spread GROUP BY timer
        """,
        arguments,
    ).fetchall()
    votes = {timer: (included, voters) for timer, included, voters in rows}
    for timer, meta_key in EXTRA_TIMERS.items():
        included, voters = votes.get(timer, (0, 0))
        if voters:
            share = included / voters
            if share >= INCLUSION_AGREEMENT:
                decided[meta_key] = True
            elif share <= 1 - INCLUSION_AGREEMENT:
                decided[meta_key] = False
    return decided
