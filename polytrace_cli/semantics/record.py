"""What a run's numbers mean, settled once per run: deciding and storing the semantics record.

Decided at ingest (`decide_runs`, again whenever files are added to a run) and stored in
`run_semantics`; `analyze.semantics` reads it as a frame, deciding on the spot for a run whose
record is missing or older than its newest file. Plain Python and SQL: ingest loads no polars.
One record per run (`FIELDS`):

    step_time_basis    what the step time is: 'logged' (timing_s/step, which counts every timer the
                       step ran), 'logged without overheads' (timing_s/step leaves out testing or the
                       checkpoint save, which the step time then adds back: verl 0.8), or
                       'derived from stage timers' (no step total, as verl <= 0.1: Σ of the logged
                       timers); the basis of most timed training steps; null when nothing is timed
    includes_testing, includes_checkpoint
                       whether the logged step time counts the testing / checkpoint timers (run
                       meta `step_time_includes_*`, else `step_timers.step_time_inclusion`)
    balance_batch      'on' / 'off' / 'unknown': trainer.balance_batch from the printed config or
                       overrides; else 'on' when global_seqlen/balanced_max is logged, which verl
                       logs only when it balances the batch
    lambda_basis       the busiest rank that sets the training stages' time: 'per-rank samples',
                       'rank_tokens_balanced_max' (verl's global_seqlen/balanced_max: balancing on,
                       the batch is trained as balanced), 'rank_tokens_max' (global_seqlen/max);
                       null without per-rank data
    responses_per_step and its source: train_batch_size × rollout.n when both are printed, else (TRL)
                       the Trainer's printed total train batch size, else the
                       median logged count perf/total_num_tokens / (prompt_length/mean +
                       response_length/mean), else the most common count of training samples a step
    training_samples, validation_samples
                       samples by split: validation samples never enter a training analysis
    truncated_steps    steps with a log line cut short (their timers may be lost)
    crash              the fatal error the log ends with after its last metric line, or before
                       any when it has none (`ingest.crashes`: never a warning, a retry, an
                       `Exception ignored in:` block or a config entry)
    partial_steps      steps holding fewer training samples than responses_per_step, or a prompt
                       group with fewer responses than a group has (n_sampling, else the largest
                       sample index + 1)
    collapse_step, collapse_length, collapse_typical_length
                       a length collapse: the first step k (at least 3 steps in, at least 3 steps
                       before the end) from which every step's mean response length stays at or
                       below 5% of the median m of the steps before k; collapse_length is the mean
                       over the collapsed steps and collapse_typical_length is m
    execution_mode, execution_mode_evidence
                       how the run executed (sync, one-step-off, fully-async, colocate-async,
                       separate-async, async-grpo) and the config keys and metric families it was decided
                       from (`semantics.execution_mode`)
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from itertools import accumulate

import duckdb

from polytrace_cli.semantics import execution_mode, step_facts
from polytrace_cli.semantics import step_timers
from polytrace_cli.store.catalog import steps_of_runs_sql

LOGGED, WITHOUT_OVERHEADS, DERIVED = "logged", "logged without overheads", "derived from stage timers"
ON, OFF, UNKNOWN = "on", "off", "unknown"
# The λ bases name the canonical metrics (`metric_aliases`) that set the busiest rank.
PER_RANK_SAMPLES, BALANCED_MAX, PRE_BALANCING_MAX = "per-rank samples", "rank_tokens_balanced_max", "rank_tokens_max"
RANK_TOKENS_MEAN = "rank_tokens_mean"
FROM_CONFIG = "train_batch_size × rollout.n"
FROM_LOGGED_COUNTS = "perf/total_num_tokens / (prompt_length/mean + response_length/mean)"
FROM_SAMPLES = "training samples per step (most common count)"
# TRL: every completion is one row of the Trainer's batch, so an optimizer step trains the total train
# batch size the Trainer (or Unsloth's banner) prints.
FROM_TOTAL_BATCH = "the Trainer's total train batch size (one completion per row)"
COLLAPSE_SHARE = 0.05
COLLAPSE_MIN_STEPS = 3
# The record's fields, in the order of the `run_semantics` columns after run_id.
FIELDS = ("step_time_basis", "includes_testing", "includes_checkpoint", "balance_batch", "balance_batch_source",
          "lambda_basis", "responses_per_step", "responses_per_step_source", "training_samples",
          "validation_samples", "truncated_steps", "crash", "partial_steps", "collapse_step", "collapse_length",
          "collapse_typical_length", "execution_mode", "execution_mode_evidence")


# The temporary table holding the `steps` rows of the run being decided when its step facts cannot
# be kept (a read-only store), read once per decision.
RUN_STEPS_FROM_VIEW = "semantics_run_steps"


def _read_run_steps(con: duckdb.DuckDBPyConnection, run_id: int, columns: list[str]) -> str | None:
    """The table holding the run's `steps` rows with the columns the decision reads
    (`step_timers.decision_columns`): the run's steps kept from its facts (`step_facts.run_steps_table`),
    None when they cannot be kept, the rows then read from the run's pairs as the `steps` view gives them
    (`catalog.steps_of_runs_sql`) into RUN_STEPS_FROM_VIEW."""
    table = step_facts.run_steps_table(con, run_id, columns)
    if table is None:
        listed = ", ".join(["segment", "step", *columns, "is_validation_only", "has_testing", "has_checkpoint"])
        con.execute(f"CREATE OR REPLACE TEMP TABLE {RUN_STEPS_FROM_VIEW} AS SELECT {listed}"
                    f" FROM ({steps_of_runs_sql(f'({int(run_id)})', columns)})")
    return table


def _meta(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, dict, bool]:
    """(the run's name, its meta, whether it holds any sample: a row of `sample_rows` or `sample_groups`)."""
    name, meta, samples = con.execute(
        "SELECT name, meta, EXISTS (SELECT 1 FROM sample_rows WHERE run_id = $1)"
        " OR EXISTS (SELECT 1 FROM sample_groups WHERE run_id = $1) FROM runs WHERE run_id = $1", [run_id]).fetchall()[0]
    return name, json.loads(meta or "{}"), samples


def _timing(con: duckdb.DuckDBPyConnection, run_id: int, meta: dict, timers: list[str], run_steps: str) -> dict:
    any_timer = " OR ".join(f"{column} IS NOT NULL" for column in timers)
    logged, derived, testing, checkpoint = con.execute(
        f"""
        SELECT count(*) FILTER (WHERE step_s IS NOT NULL AND NOT is_validation_only),
               count(*) FILTER (WHERE step_s IS NULL AND NOT is_validation_only AND ({any_timer})),
               bool_or(has_testing), bool_or(has_checkpoint)
        FROM {run_steps}
        """).fetchall()[0]
    keys = step_timers.EXTRA_TIMERS.values()
    decided = meta if all(key in meta for key in keys) else step_timers.step_time_inclusion(con, run_id)
    testing_in, checkpoint_in = (decided.get(key) for key in keys)
    if not logged and not derived:
        basis = None
    elif logged >= derived:
        left_out = (testing and testing_in is False) or (checkpoint and checkpoint_in is False)
        basis = WITHOUT_OVERHEADS if left_out else LOGGED
    else:
        basis = DERIVED
    return {"step_time_basis": basis, "includes_testing": testing_in, "includes_checkpoint": checkpoint_in}


def _balance(con: duckdb.DuckDBPyConnection, run_id: int, meta: dict, from_facts: bool, samples: bool) -> dict:
    # The step facts hold a row per step and canonical name that any of the run's pairs maps to; each
    # name is looked for until its first row.
    names = (PRE_BALANCING_MAX, RANK_TOKENS_MEAN, BALANCED_MAX)
    if from_facts:
        found = con.execute("SELECT " + ", ".join(
            "EXISTS (SELECT 1 FROM step_facts WHERE run_id = $1 AND canonical = $%d)" % (index + 2)
            for index in range(len(names))), [run_id, *names]).fetchall()[0]
        seqlen = {name for name, present in zip(names, found) if present}
    else:
        seqlen = {row[0] for row in con.execute(
            "SELECT DISTINCT canonical FROM named_step_metrics WHERE run_id = ? AND canonical IN (?, ?, ?)",
            [run_id, *names]).fetchall()}
    told = meta.get("balance_batch")
    if isinstance(told, bool):
        balance, source = (ON if told else OFF), "trainer.balance_batch (printed config or overrides)"
    elif BALANCED_MAX in seqlen:
        balance, source = ON, "global_seqlen/balanced_max is logged (verl logs it only when it balances the batch)"
    else:
        balance, source = UNKNOWN, None
    # The rows of `samples`, read from its two tables without unnesting the groups' lengths.
    ranked = samples and con.execute(
        """
        SELECT EXISTS (
            SELECT 1 FROM (
                SELECT step, coalesce(dp_rank, rank) AS dp FROM sample_rows
                WHERE run_id = $1 AND NOT coalesce(validate, false) AND coalesce(tp_rank, 0) = 0
                UNION ALL
                SELECT step, coalesce(dp_rank, rank) FROM sample_groups
                WHERE run_id = $1 AND NOT coalesce(validate, false) AND coalesce(tp_rank, 0) = 0
                  AND len(response_lens) > 0
            ) WHERE dp IS NOT NULL GROUP BY step HAVING count(DISTINCT dp) >= 2)
        """, [run_id]).fetchall()[0][0]
    if ranked:
        basis = PER_RANK_SAMPLES
    elif {PRE_BALANCING_MAX, RANK_TOKENS_MEAN} <= seqlen:
        basis = BALANCED_MAX if balance == ON and BALANCED_MAX in seqlen else PRE_BALANCING_MAX
    else:
        basis = None
    return {"balance_batch": balance, "balance_batch_source": source, "lambda_basis": basis}


def _sample_counts(con: duckdb.DuckDBPyConnection, run_id: int, samples: bool) -> list[tuple[int, int, int]]:
    """Per step, in step order: (step, training samples, validation samples); none without `samples`."""
    if not samples:
        return []
    return con.execute(
        """
        WITH counted AS (
            SELECT step, coalesce(validate, false) AS validate, count(*)::BIGINT AS n
            FROM sample_rows WHERE run_id = $1 GROUP BY ALL
            UNION ALL
            SELECT step, coalesce(validate, false), sum(len(response_lens))::BIGINT
            FROM sample_groups WHERE run_id = $1 GROUP BY ALL
        )
        SELECT step::BIGINT, coalesce(sum(n) FILTER (WHERE NOT validate), 0)::BIGINT,
               coalesce(sum(n) FILTER (WHERE validate), 0)::BIGINT
        FROM counted GROUP BY step ORDER BY step
        """, [run_id]).fetchall()


def _responses(con: duckdb.DuckDBPyConnection, run_id: int, meta: dict, counts: list[tuple[int, int, int]],
               run_steps: str, samples: bool) -> dict:
    batch, n = meta.get("train_batch_size"), meta.get("n_sampling")
    trained = [(step, training) for step, training, _ in counts if training > 0]
    total = meta.get("trl_total_batch_size")
    if isinstance(batch, int) and isinstance(n, int) and batch > 0 and n > 0:
        per_step, source = float(batch * n), FROM_CONFIG
    elif isinstance(total, int) and not isinstance(total, bool) and total > 0:
        per_step, source = float(total), FROM_TOTAL_BATCH
    else:
        logged = con.execute(
            f"""
            SELECT median(round(total_tokens / (prompt_length_mean + response_length_mean)))
            FROM {run_steps} WHERE NOT is_validation_only
              AND total_tokens > 0 AND prompt_length_mean + response_length_mean > 0
            """).fetchall()[0][0]
        if logged is not None:
            per_step, source = float(logged), FROM_LOGGED_COUNTS
        elif trained:
            per_step, source = float(max(statistics.multimode(count for _, count in trained))), FROM_SAMPLES
        else:
            per_step, source = None, None
    partial = {step for step, count in trained if per_step is not None and count < per_step}
    if samples:
        partial |= _short_group_steps(con, run_id, n if isinstance(n, int) and n > 1 else None)
    return {"responses_per_step": per_step, "responses_per_step_source": source, "partial_steps": sorted(partial)}


def _short_group_steps(con: duckdb.DuckDBPyConnection, run_id: int, group_size: int | None) -> set[int]:
    """Steps holding a prompt group with fewer responses than a group has: n_sampling when printed,
    else the largest sample index + 1 over the run's per-response rows (at least 2)."""
    rows = con.execute(
        """
        WITH g AS (
            SELECT step, coalesce(dp_rank, rank) AS dp_rank, prompt_idx, count(*) AS responses
            FROM sample_rows
            WHERE run_id = $1 AND NOT coalesce(validate, false) AND prompt_idx IS NOT NULL GROUP BY ALL
        ), n AS (
            SELECT coalesce($2, max(sample_idx) + 1) AS size FROM sample_rows
            WHERE run_id = $1 AND NOT coalesce(validate, false)
        )
        SELECT DISTINCT step FROM g, n WHERE n.size >= 2 AND g.responses < n.size
        """, [run_id, group_size]).fetchall()
    return {row[0] for row in rows}


def _mean_lengths(con: duckdb.DuckDBPyConnection, run_id: int, run_steps: str,
                  samples: bool) -> tuple[list[int], list[float]]:
    """(steps, mean response length) of the training steps, logged or from the samples (when the run
    holds any, `samples`)."""
    # Two lists rather than a row per step (no tuple per step for the garbage collector to walk).
    steps, means = con.execute(
        f"""
        SELECT list(step ORDER BY step), list(mean ORDER BY step) FROM (
            SELECT step, avg(response_length_mean) AS mean FROM {run_steps}
            WHERE NOT is_validation_only AND response_length_mean IS NOT NULL GROUP BY step)
        """).fetchall()[0]
    if steps:
        return steps, [float(mean) for mean in means]
    if not samples:
        return [], []
    # avg(response_len) over `samples`, from its two tables without unnesting the groups' lengths.
    rows = con.execute(
        """
        SELECT step, sum(total) / sum(n) FROM (
            SELECT step, sum(response_len) AS total, count(response_len) AS n FROM sample_rows
            WHERE run_id = $1 AND NOT coalesce(validate, false) GROUP BY step
            UNION ALL
            SELECT step, sum(list_sum(response_lens)), sum(list_count(response_lens)) FROM sample_groups
            WHERE run_id = $1 AND NOT coalesce(validate, false) GROUP BY step
        ) GROUP BY step HAVING sum(n) > 0 ORDER BY step
        """, [run_id]).fetchall()
    return [row[0] for row in rows], [float(row[1]) for row in rows]


def length_collapse(steps: list[int], means: list[float]) -> tuple[int, float, float] | None:
    """(first collapsed step, mean length over the collapsed steps, typical length before) for the
    rule in the module docstring; None when the run did not collapse."""
    n = len(means)
    if n < 2 * COLLAPSE_MIN_STEPS:
        return None
    firsts = range(COLLAPSE_MIN_STEPS, n - COLLAPSE_MIN_STEPS + 1)
    before: list[float] = []
    read = 0  # the steps in `before`
    if not any(map(math.isnan, means)):
        # Without a NaN the order of max's arguments does not matter: the running maxima are taken
        # in C. The median before k is at most the largest value before k: only a k whose suffix
        # is that small needs the median.
        suffix_max = list(accumulate(reversed(means), max))[::-1]
        prefix_max = list(accumulate(means, max))
        firsts = [k for k, later, earlier in zip(firsts, suffix_max[COLLAPSE_MIN_STEPS:], prefix_max[COLLAPSE_MIN_STEPS - 1:])
                  if later <= COLLAPSE_SHARE * earlier]
        if not firsts:
            return None
        before, read = sorted(float(mean) for mean in means[:firsts[0]]), firsts[0]
    else:
        suffix_max = list(means)
        for i in range(n - 2, -1, -1):
            suffix_max[i] = max(means[i], suffix_max[i + 1])
    for k in firsts:
        for mean in means[read:k]:
            bisect.insort(before, float(mean))
        read = k
        middle = len(before) // 2
        typical = before[middle] if len(before) % 2 else (before[middle - 1] + before[middle]) / 2
        if typical > 0 and suffix_max[k] <= COLLAPSE_SHARE * typical:
            return int(steps[k]), sum(means[k:]) / (n - k), float(typical)
    return None


def decide(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """The run's semantics record (`FIELDS` and `run`, the run's name; see the module docstring)."""
    name, meta, samples = _meta(con, run_id)
    counts = _sample_counts(con, run_id, samples)
    stages, columns = step_timers.decision_columns(con)
    timers = [*stages, *(f"{timer}_s" for timer in step_timers.EXTRA_TIMERS)]  # the stages and overheads
    kept = _read_run_steps(con, run_id, columns)
    run_steps = kept or RUN_STEPS_FROM_VIEW
    try:
        record = {"run": name, **_timing(con, run_id, meta, timers, run_steps),
                  **_balance(con, run_id, meta, kept is not None, samples),
                  **_responses(con, run_id, meta, counts, run_steps, samples)}
        collapse = length_collapse(*_mean_lengths(con, run_id, run_steps, samples))
    finally:
        if kept is None:
            con.execute(f"DROP TABLE IF EXISTS {RUN_STEPS_FROM_VIEW}")
    record["training_samples"] = sum(training for _, training, _ in counts)
    record["validation_samples"] = sum(validation for _, _, validation in counts)
    record["truncated_steps"] = [row[0] for row in con.execute(
        "SELECT DISTINCT step FROM step_flags WHERE run_id = ? AND flag = 'truncated_line' ORDER BY step",
        [run_id]).fetchall()]
    record["crash"] = meta.get("crash") if isinstance(meta.get("crash"), str) else None
    record["collapse_step"], record["collapse_length"], record["collapse_typical_length"] = collapse or (None,) * 3
    record.update(execution_mode.decide_mode(con, run_id, meta))
    return record


def store(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """Decide the run's record and write it to `run_semantics` (replacing the previous one)."""
    record = decide(con, run_id)
    con.execute("DELETE FROM run_semantics WHERE run_id = ?", [run_id])
    con.execute(f"INSERT INTO run_semantics (run_id, {', '.join(FIELDS)}) VALUES (?{', ?' * len(FIELDS)})",
                [run_id, *(record[name] for name in FIELDS)])
    return record


def runs_without_current_record(con: duckdb.DuckDBPyConnection) -> list[int]:
    """The runs holding a file whose record is missing or older than their newest file: what an
    ingest killed after committing files, before deciding their runs, leaves (a re-ingest of the same
    files changes none of them, so only this finds those runs)."""
    return [run_id for (run_id,) in con.execute(
        """
        SELECT r.run_id FROM runs r
        WHERE EXISTS (SELECT 1 FROM files f WHERE f.run_id = r.run_id)
          AND NOT EXISTS (SELECT 1 FROM run_semantics s WHERE s.run_id = r.run_id
                          AND NOT EXISTS (SELECT 1 FROM files f WHERE f.run_id = s.run_id
                                          AND f.ingested_at > s.decided_at))
        ORDER BY r.run_id
        """).fetchall()]


def decide_runs(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> None:
    """Store the record of each run that still exists, one transaction for all (the end-of-ingest hook)."""
    present = [row[0] for row in con.execute(
        "SELECT run_id FROM runs WHERE run_id IN (SELECT unnest(?)) ORDER BY run_id", [sorted(set(run_ids))]).fetchall()]
    if not present:
        return
    con.execute("BEGIN TRANSACTION")
    try:
        for run_id in present:
            store(con, run_id)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def stored_records(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[int, dict]:
    """run id -> its stored record (`FIELDS` and `run`) when still current: none of the run's files is
    newer than the record."""
    exists = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'run_semantics'"
                         ).fetchall()[0][0]
    if not exists:
        return {}
    rows = con.execute(
        f"""
        SELECT s.run_id, r.name, {', '.join(f's.{name}' for name in FIELDS)}
        FROM run_semantics s JOIN runs r USING (run_id)
        WHERE s.run_id IN (SELECT unnest(?))
          AND NOT EXISTS (SELECT 1 FROM files f WHERE f.run_id = s.run_id AND f.ingested_at > s.decided_at)
        """, [run_ids]).fetchall()
    # A record stored before the execution mode existed is not current: it is decided again.
    return {row[0]: dict(zip(["run", *FIELDS], row[1:])) for row in rows if row[-2] is not None}


def records(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> list[dict]:
    """One record per run, in run-id order: the stored one, or decided now for a run without a current one."""
    stored = stored_records(con, run_ids)
    return [stored.get(run_id) or decide(con, run_id) for run_id in sorted(set(run_ids))]
