"""Helpers every analysis shares: step ranges, run names, and SQL snippets that select training
samples, step aggregates and length caps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from polytrace_cli.errors import PolytraceError
from polytrace_cli.store import queries
from polytrace_cli.store.catalog import steps_of_runs_sql

if TYPE_CHECKING:
    import duckdb
    import polars as pl

TRAINING_SAMPLES = "coalesce(validate, false) = false"
VALIDATION_SAMPLES = "coalesce(validate, false) = true"
# The splits of a run's samples: training (validate not true) and validation (validate true).
TRAINING, VALIDATION = "training", "validation"
SPLITS = (TRAINING, VALIDATION)
SPLIT_SAMPLES = {TRAINING: TRAINING_SAMPLES, VALIDATION: VALIDATION_SAMPLES}
# A longest length shared by at least this share (and this many) of a run's responses marks a cap.
EVIDENT_CAP_SHARE = 0.01
EVIDENT_CAP_MIN_COUNT = 3


@dataclass(frozen=True)
class StepRange:
    """An inclusive range of steps of one split of the samples; None on either side means unbounded.

    `split` is the samples the sample-reading analyses read (`samples_sql`): 'training' (validate not
    true, the default) or 'validation' (validate true). Step metrics are training steps in either.
    """

    first: int | None = None
    last: int | None = None
    split: str = TRAINING

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise PolytraceError(f"split takes {' or '.join(SPLITS)}, not {self.split!r}")

    def of_split(self, split: str | None) -> "StepRange":
        """The same steps of the named split (None: this range's split)."""
        return self if split is None else StepRange(self.first, self.last, split)

    @classmethod
    def parse(cls, text: str | None) -> "StepRange":
        """'A:B', 'A:', ':B' or 'N' (a single step); None means every step.

        A range that holds no step (A > B) or an empty text is an error, never a silent empty selection.
        """
        if text is None:
            return cls()
        try:
            if ":" not in text:
                return cls(int(text), int(text))
            first, last = text.split(":", 1)
            parsed = cls(int(first) if first.strip() else None, int(last) if last.strip() else None)
        except ValueError:
            raise PolytraceError(f"--steps takes A:B, A:, :B or N, not {text!r}") from None
        if parsed.first is not None and parsed.last is not None and parsed.first > parsed.last:
            raise PolytraceError(f"--steps {text} is empty: the first step is after the last")
        return parsed

    @classmethod
    def of(cls, value: "StepRange | str | int | None") -> "StepRange":
        """A StepRange as given, a single step, or parsed from 'A:B' text (None: every step)."""
        if isinstance(value, StepRange):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value, value)
        if value is None or isinstance(value, str):
            return cls.parse(value)
        raise PolytraceError(f"steps takes 'A:B', a step number or a StepRange, not {value!r}")

    def sql(self, column: str = "step") -> str:
        """A SQL condition restricting `column` to the range ('true' when unbounded)."""
        parts = []
        if self.first is not None:
            parts.append(f"{column} >= {int(self.first)}")
        if self.last is not None:
            parts.append(f"{column} <= {int(self.last)}")
        return " AND ".join(parts) or "true"


ALL_STEPS = StepRange()


def run_names(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[int, str]:
    """run_id -> name for the given runs."""
    rows = con.execute("SELECT run_id, name FROM runs WHERE run_id IN (SELECT unnest(?))", [run_ids]).fetchall()
    return dict(rows)


# The columns of `run_facts`, for its consumers.
RUN_FACTS_COLUMNS = ("run", "task", "samples")


def run_facts(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> pl.DataFrame:
    """One row per run, by name: run (String), task (String), samples (Int64, its count of responses)."""
    import polars as pl

    return con.sql(
        """
        SELECT r.name AS run, r.task, coalesce(s.samples, 0)::BIGINT AS samples
        FROM runs r LEFT JOIN (SELECT run_id, count(*) AS samples FROM samples GROUP BY run_id) s USING (run_id)
        WHERE r.run_id IN (SELECT unnest(?)) ORDER BY r.name
        """,
        params=[run_ids],
    ).pl().cast({"run": pl.String, "task": pl.String, "samples": pl.Int64})


def frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pl.DataFrame:
    """Run SQL and return a polars DataFrame."""
    return con.sql(sql, params=params or None).pl()


def small_frame(con: duckdb.DuckDBPyConnection, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Run SQL whose result is a few rows and return it as a polars DataFrame of the declared `schema`.

    The rows travel as Python values instead of through Arrow: for a summary of a few rows that
    spares loading pyarrow (about 150 ms and 45 MB). The SQL must return the schema's columns in
    its order, each already of the declared type (DOUBLE for Float64, BIGINT for Int64, ...).
    """
    import polars as pl

    cursor = con.execute(sql)
    columns = [column[0] for column in cursor.description]
    if columns != list(schema):
        raise ValueError(f"query returns columns {columns}, not the declared {list(schema)}")
    return pl.DataFrame(cursor.fetchall(), schema=schema, orient="row")


def ids_sql(run_ids: list[int]) -> str:
    """A SQL list literal of run ids for `run_id IN ...` ('(NULL)' when empty)."""
    return "(" + ", ".join(str(int(i)) for i in run_ids) + ")" if run_ids else "(NULL)"


def training_samples_sql(run_ids: list[int], steps: StepRange = ALL_STEPS) -> str:
    """SELECT of the training samples (validate not true) of the runs within the step range, whatever
    its split."""
    return f"SELECT * FROM samples WHERE run_id IN {ids_sql(run_ids)} AND {TRAINING_SAMPLES} AND {steps.sql('step')}"


def samples_sql(run_ids: list[int], steps: StepRange = ALL_STEPS) -> str:
    """SELECT of the samples of the range's split (training: validate not true; validation: validate
    true) of the runs within the step range."""
    return (f"SELECT * FROM samples WHERE run_id IN {ids_sql(run_ids)} AND {SPLIT_SAMPLES[steps.split]} "
            f"AND {steps.sql('step')}")


def caps_sql(run_ids: list[int]) -> str:
    """SQL of (run_id, run, cap_tokens, cap_source) for the runs; the rule is in `lengths.caps`."""
    ids = ids_sql(run_ids)
    return f"""
        WITH s AS (
            SELECT run_id, response_len FROM samples
            WHERE run_id IN {ids} AND {TRAINING_SAMPLES} AND response_len IS NOT NULL
        ), top AS (
            SELECT run_id, count(*) AS responses, max(response_len) AS max_len FROM s GROUP BY run_id
        ), at_max AS (
            SELECT s.run_id, count(*) AS at_max FROM s JOIN top ON s.run_id = top.run_id AND s.response_len = top.max_len
            GROUP BY s.run_id
        ), c AS (
            SELECT r.run_id, r.name AS run,
                   TRY_CAST(json_extract_string(r.meta, '$.max_response_len') AS BIGINT) AS known,
                   CASE WHEN at_max.at_max >= {EVIDENT_CAP_MIN_COUNT}
                         AND at_max.at_max >= {EVIDENT_CAP_SHARE} * top.responses THEN top.max_len END AS evident
            FROM runs r LEFT JOIN top USING (run_id) LEFT JOIN at_max USING (run_id)
            WHERE r.run_id IN {ids}
        )
        SELECT run_id, run, coalesce(known, evident) AS cap_tokens,
               CASE WHEN known IS NOT NULL THEN 'known' WHEN evident IS NOT NULL THEN 'evident' END AS cap_source
        FROM c
    """


# The `steps` columns of a run's logged length aggregates (`step_aggregate_rows_sql`).
AGGREGATE_LENGTH_COLUMNS = ["response_length_mean", "response_length_min", "response_length_max", "clip_ratio",
                            "prompt_length_mean", "prompt_length_min", "prompt_length_max"]


def step_aggregate_rows_sql(run_ids: list[int], steps: StepRange) -> str:
    """Per step of step-aggregate runs (no training samples: validation samples, e.g. a wandb
    validation table, are their own split and never replace the logged training aggregates): logged
    response and prompt mean/min/max/clip ratio. None in the validation split: the logged aggregates
    are the training batch's."""
    ids = ids_sql(run_ids)
    training = "true" if steps.split == TRAINING else "false"
    return f"""
        WITH st AS (
            SELECT * FROM ({steps_of_runs_sql(ids, AGGREGATE_LENGTH_COLUMNS, steps.sql('step'))})
            WHERE {training}
              AND run_id NOT IN (SELECT DISTINCT run_id FROM samples WHERE run_id IN {ids} AND {TRAINING_SAMPLES})
              AND NOT coalesce(is_validation_only, false)
            QUALIFY row_number() OVER (PARTITION BY run_id, step ORDER BY segment DESC) = 1
        )
        SELECT run_id, step, 'response' AS kind, response_length_mean AS mean_tokens,
               response_length_min AS min_tokens, response_length_max AS max_tokens, clip_ratio
        FROM st WHERE response_length_mean IS NOT NULL
        UNION ALL
        SELECT run_id, step, 'prompt', prompt_length_mean, prompt_length_min, prompt_length_max, NULL
        FROM st WHERE prompt_length_mean IS NOT NULL
    """



def step_clock_sql(run_ids: list[int], steps: StepRange = ALL_STEPS) -> str:
    """SQL of each step's wall clock of the runs within the step range (`store.queries.step_clock_sql`)."""
    return queries.step_clock_sql(ids_sql(run_ids), steps.sql())
