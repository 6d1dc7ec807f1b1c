"""Findings: where the runs' time and work go, run by run, largest first, built from the registered analyses.

Each finding is a dict `{cause, seconds, share, steps, text, on_page}` (plus `run`):

- cause: what the time or work is lost to (`slot-idle`, `dp-idle`, `validation`, `checkpoint`,
  `stage:<name>`, `dapo-discarded`), or `not-measured` for what the runs cannot tell;
- seconds: seconds of step time it took over the steps counted, when the logs time it (else null);
- share: its share of the quantity named in the text (step time, decode slots, rank time, tokens);
- steps: how many steps it was measured over;
- text: one sentence saying all that;
- on_page: whether the report's page shows it (`mark_on_page`: every caveat, and per run the first SHOWN
  costs of at least ON_PAGE_SHARE; the rest are in summary.json only).

Per run, the caveats (CAVEATS) come first, then the costs ranked by share (`rank_key`).

The shares:

- slot idle (longtail) = mean over (step, rank) batches of 1 − Σl / (N · max l): decode slots waiting
  for the batch's longest response;
- DP idle (imbalance) = 1 − 1/λ on the quantity that sets the step time (`saving_basis`: makespan λ for
  sampled runs, token λ for global_seqlen runs), averaged over steps: rank time spent waiting for the
  slowest rank;
- validation / checkpoint = Σ testing_s (save_checkpoint_s) / Σ step_s, over the steps with a step
  time (step_s the canonical step time, which adds back a timer the logged total leaves out);
- stage:<name> = the largest stage's share of step time (stages summary `share`);
- DAPO discarded = the filtering summary's discarded_token_share (tokens generated for prompts the
  filter dropped).

Before them, what the run's semantics record (`analyze.semantics`) says about the numbers themselves,
each with no seconds or share: `length-collapse` (responses collapsed to a few tokens and stayed
there: comparisons against the run's typical step read a collapsed run), `crash` (the error the log
ends with), `partial-steps` (steps holding fewer responses than a step has) and `truncated-lines`
(steps whose log line was cut short, their timers lost).

For a run with step timings that `polytrace explain` can model (`diagnose.explain_run`, basis
'seconds'), the run's findings are explain's instead: seconds beyond the run's typical step per cause
(explain's cause words: `long_tail`, `dp_imbalance`, `validation`, `unexplained`, ...), ranked by
seconds, share = seconds / the run's wall time, `steps` the number of steps and `at_steps` their list;
then the analyses' entries explain does not cover (`NOT_IN_EXPLAIN` and the largest stage). An asynchronous
run's findings start with what bounds it (`bound`: explain's run-level bound, its seconds per step × the
steps it was measured on, its share of the mean step, and the framework's rule of thumb where one
applies). A run explain cannot model keeps
the analyses' entries; when explain fails on a run, a `not-modelled` finding says why.
"""

from __future__ import annotations

import duckdb
import polars as pl

from polytrace_cli.analyze import filtering, imbalance, longtail, stages
from polytrace_cli.analyze.common import StepRange, run_names
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.display import duration

FINDING_KEYS = ("run", "cause", "seconds", "share", "steps", "text", "on_page")
# A finding from explain also lists the steps it was found at.
EXPLAINED_FINDING_KEYS = (*FINDING_KEYS, "at_steps")
# Causes of the analyses that explain's decomposition does not cover: kept after explain's findings.
NOT_IN_EXPLAIN = ("slot-idle", "dapo-discarded")
# Per run, the page shows at most SHOWN costs, each of at least ON_PAGE_SHARE; every finding is in summary.json.
SHOWN = 4
ON_PAGE_SHARE = 0.005
# What a run's numbers mean, rather than what its time costs: always on the page, before the costs.
CAVEATS = ("length-collapse", "crash", "partial-steps", "truncated-lines", "not-modelled", "not-measured")


def _finding(run: str, cause: str, seconds: float | None, share: float | None, steps: int, text: str) -> dict:
    return {"run": run, "cause": cause, "seconds": seconds, "share": share, "steps": int(steps), "text": text}


def _rows(summary: pl.DataFrame | None, schema: dict) -> pl.DataFrame:
    return summary if summary is not None and summary.height else pl.DataFrame(schema=schema)


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def _step_word(count: int, basis: str | None) -> str:
    word = "workload step" if basis == "samples" else "trainer step"
    return f"{count} {word}{'' if count == 1 else 's'}"


def _longtail(summary: pl.DataFrame) -> list[dict]:
    out = []
    for row in _rows(summary, longtail.SUMMARY_COLUMNS).iter_rows(named=True):
        if row["mean_slot_idle"] is None:
            continue
        estimate = " (estimated from each step's mean and max)" if row["estimate"] else ""
        out.append(_finding(
            row["run"], "slot-idle", None, row["mean_slot_idle"], row["steps"],
            f"{row['run']}: {_percent(row['mean_slot_idle'])} of decode slots sit idle waiting for their batch's "
            f"longest response{estimate}, over {_step_word(row['steps'], row['basis'])}."))
    return out


def _imbalance(summary: pl.DataFrame) -> list[dict]:
    out = []
    for row in _rows(summary, imbalance.SUMMARY_COLUMNS).iter_rows(named=True):
        if row["mean_lambda"] is None:
            continue
        if row["saving_basis"] == "makespan" and row["mean_makespan_lambda"]:
            share, what = 1 - 1 / row["mean_makespan_lambda"], f"makespan λ {row['mean_makespan_lambda']:.2f}"
        else:
            share, what = row["mean_idle_share"], f"token λ {row['mean_lambda']:.2f}"
        if share is None:
            continue
        out.append(_finding(
            row["run"], "dp-idle", None, share, row["steps"],
            f"{row['run']}: data-parallel ranks wait {_percent(share)} of their time for the slowest rank "
            f"({what}, which sets the step time), over {_step_word(row['steps'], row['basis'])}."))
    return out


def _overheads(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> list[dict]:
    detail = shared(stages.per_step, con, run_ids, steps).filter(pl.col("step_s").is_not_null())
    if detail.height == 0:
        return []
    inclusion = shared(stages.step_time_inclusion, con, run_ids)
    out = []
    for cause, column, flag, name in (
            ("validation", "testing_s", "includes_testing", "validation"),
            ("checkpoint", "save_checkpoint_s", "includes_checkpoint", "checkpoint saving")):
        included = dict(zip(inclusion["run"].to_list(), inclusion[flag].to_list()))
        totals = detail.group_by("run", maintain_order=True).agg(
            seconds=pl.col(column).fill_null(0).sum(), step_seconds=pl.col("step_s").sum(),
            steps=(pl.col(column).fill_null(0) > 0).sum(), all_steps=pl.len())
        for row in totals.iter_rows(named=True):
            if not row["seconds"]:
                continue
            inside = included.get(row["run"])
            # step_s is the canonical step time: a timer the logged total leaves out is already added back.
            total = row["step_seconds"]
            caveat = " (assuming the step timer includes it)" if inside is None else ""
            share = row["seconds"] / total if total else None
            out.append(_finding(
                row["run"], cause, row["seconds"], share, row["steps"],
                f"{row['run']}: {name} took {row['seconds']:,.0f} s in {row['steps']} of {row['all_steps']} trainer "
                f"steps, {_percent(share)} of step time{caveat}."))
    return out


def _semantics(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> list[dict]:
    """The findings of the runs' semantics records (see the module docstring)."""
    from polytrace_cli.analyze.semantics import semantics

    out = []
    for row in semantics(con, run_ids).iter_rows(named=True):
        run = row["run"]
        if row["collapse_step"] is not None:
            out.append(_finding(
                run, "length-collapse", None, None, 0,
                f"{run}: response lengths collapsed from step {row['collapse_step']:,} on (mean "
                f"{row['collapse_length']:,.1f} tokens, against {row['collapse_typical_length']:,.0f} before) and never "
                "recovered: its typical step mixes both regimes."))
        if row["crash"]:
            out.append(_finding(run, "crash", None, None, 0,
                                f"{run}: the job ended on a fatal error after its last logged line: {row['crash']}"))
        per_step = (
            ("partial-steps", row["partial_steps"],
             f"hold fewer responses than a step has ({row['responses_per_step_source'] or 'prompt groups short'})"),
            ("truncated-lines", row["truncated_steps"],
             "had a log line cut short (wandb cuts output.log lines at 4,096 characters): their later timers are "
             "lost"),
        )
        for cause, steps, what in per_step:
            if steps:
                out.append(_finding(run, cause, None, None, len(steps),
                                    f"{run}: {len(steps)} step{'s' if len(steps) != 1 else ''} (first {steps[0]:,}) "
                                    f"{what}."))
    return out


def _largest_stage(summary: pl.DataFrame, with_overheads: set[str]) -> list[dict]:
    """The largest stage's share of each run's step time; `with_overheads` are the runs whose step time
    holds validation or checkpoints (the sentence says the share counts those steps too)."""
    rows = _rows(summary, stages.SUMMARY_COLUMNS).filter(
        (pl.col("stage") != "step") & pl.col("share").is_not_null())
    overheads = {run: ", validation and checkpoint steps included" for run in with_overheads}
    out = []
    for run in rows["run"].unique(maintain_order=True).to_list():
        top = rows.filter(pl.col("run") == run).sort("share", descending=True).row(0, named=True)
        seconds = top["mean_s"] * top["steps"] if top["mean_s"] is not None else None
        out.append(_finding(
            run, f"stage:{top['stage']}", seconds, top["share"], top["steps"],
            f"{run}: the largest stage, {top['stage']}, takes {_percent(top['share'])} of all step time "
            + (f"({duration(seconds)} over {top['steps']} trainer steps" if seconds is not None
               else f"(over {top['steps']} trainer steps") + f"{overheads.get(run, '')})."))
    return out


def _filtering(summary: pl.DataFrame) -> list[dict]:
    out = []
    for row in _rows(summary, filtering.SUMMARY_COLUMNS).iter_rows(named=True):
        if row["discarded_token_share"] is None:
            continue
        unit = "generated tokens" if row["basis"] == "samples" else "generated prompts"
        out.append(_finding(
            row["run"], "dapo-discarded", None, row["discarded_token_share"], row["batches"],
            f"{row['run']}: the DAPO filter discards {_percent(row['discarded_token_share'])} of {unit} "
            f"({row['batches']} generation batches feeding {row['trainer_steps']} trainer steps)."))
    return out


def _explained(con: duckdb.DuckDBPyConnection, run_id: int, run: str) -> tuple[list[dict] | None, str | None]:
    """explain's findings of a run in this module's shape (`steps` the count, `at_steps` the list) and
    None, or None and the reason when explain fails; (None, None) when explain has nothing to model
    (no steps, no step timings, too few steps: explain is not run, its token-based answer is not used)."""
    from polytrace_cli.diagnose import explain_run
    from polytrace_cli.diagnose.explain import explained_in_seconds
    from polytrace_cli.errors import PolytraceError
    from polytrace_cli.model import logs_step_metrics, read_workload

    try:
        if not logs_step_metrics(con, run_id) or not explained_in_seconds(read_workload(con, run_id)):
            return None, None
        explanation = explain_run(con, run_id)
    except PolytraceError:
        return None, None
    except Exception as error:  # noqa: BLE001 - one run's failure must not break the report
        return None, f"{type(error).__name__}: {error}".splitlines()[0]
    if explanation.basis != "seconds":
        return None, None
    out = []
    for found in explanation.findings:
        at_steps = [int(step) for step in found["steps"]]
        finding = _finding(run, found["cause"], found["seconds"], found["share"], len(at_steps),
                           f"{run}: {found['text']}.")
        finding["at_steps"] = at_steps
        out.append(finding)
    from polytrace_cli.diagnose.bounds import bound_finding

    bound = bound_finding(explanation.bounds)
    if bound is not None:
        # What bounds an asynchronous run, first.
        seconds, share, count, at_steps, text = bound
        finding = _finding(run, "bound", seconds, share, count, f"{run}: {text}.")
        finding["at_steps"] = at_steps
        out.insert(0, finding)
    return out, None


Explained = dict[int, tuple[list[dict] | None, str | None]]


def explained_by_run(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> Explained:
    """run id -> explain's findings of the run and the reason it failed (see `_explained`)."""
    return {run_id: _explained(con, run_id, run) for run_id, run in run_names(con, run_ids).items()}


def build_findings(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange,
                   summaries: dict[str, pl.DataFrame], explained: Explained | None = None) -> list[dict]:
    """The findings of the runs, run by run in report order: first the caveats (CAVEATS: what the semantics
    record says about the numbers, a failed explanation, what could not be measured; a run the analyses
    could say nothing about gets a `not-measured` one, so no run goes without an entry), then the run's
    costs ranked by share, largest first (`rank_key`). A run explain can model has explain's findings and
    the analyses' entries explain does not cover (NOT_IN_EXPLAIN and the largest stage); another run the
    analyses' entries. Each finding says whether the page shows it (`on_page`, see `mark_on_page`).
    See the module docstring for each share. `explained` is `explained_by_run` when computed already (the
    report's second process computes it)."""
    overheads = _overheads(con, run_ids, steps)
    analysed = [
        *_longtail(summaries.get("longtail")), *_imbalance(summaries.get("imbalance")), *overheads,
        *_largest_stage(summaries.get("stages"), {f["run"] for f in overheads}),
        *_filtering(summaries.get("filtering")),
    ]
    if explained is None:
        explained = explained_by_run(con, run_ids)
    semantic = _semantics(con, run_ids)
    out: list[dict] = []
    for run_id, run in run_names(con, run_ids).items():
        found, error = explained[run_id]
        caveats = [f for f in semantic if f["run"] == run]
        if error is not None:
            caveats.append(_finding(
                run, "not-modelled", None, None, 0,
                f"{run}: the step-time explanation failed ({error}); its findings are the analyses'."))
        mine = [f for f in analysed if f["run"] == run]
        if found:
            costs = found + [f for f in mine if f["cause"] in NOT_IN_EXPLAIN or f["cause"].startswith("stage:")]
        else:
            costs = mine
        if not costs:
            caveats.append(_finding(
                run, "not-measured", None, None, 0,
                f"{run}: no time sink could be measured: the run has no per-sample lengths, rank loads, "
                "stage timings or DAPO filter batches."))
        elif all(f["seconds"] is None for f in costs):
            caveats.append(_finding(
                run, "not-measured", None, None, 0,
                f"{run}: no step timings, so these are shares of decode slots, rank time or tokens, not seconds."))
        costs.sort(key=rank_key)
        out += mark_on_page(caveats + costs)
    return out


def rank_key(finding: dict) -> tuple:
    """Costs ranked by the share they cost (of the run, of step time, of decode slots, rank time or
    tokens, as the finding says), largest first; findings without a share last, by seconds."""
    return (finding["share"] is None, -(finding["share"] or 0.0), -(finding["seconds"] or 0.0), finding["cause"])


def mark_on_page(findings: list[dict]) -> list[dict]:
    """One run's findings with `on_page` set: every caveat (CAVEATS), and the first SHOWN costs whose share is
    at least ON_PAGE_SHARE (a cost without a share is shown when its seconds are unknown too: it cannot be
    told small); the others stay in summary.json only."""
    shown = 0
    for finding in findings:
        if finding["cause"] in CAVEATS:
            finding["on_page"] = True
            continue
        share = finding["share"]
        large = share is None and finding["seconds"] is None or share is not None and share >= ON_PAGE_SHARE
        finding["on_page"] = bool(large and shown < SHOWN)
        shown += finding["on_page"]
    return findings
