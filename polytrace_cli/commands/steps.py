"""`polytrace steps RUN`: one row per step of a run (stage seconds, lengths, load balance, flags)."""

from __future__ import annotations

from typing import Annotated

import typer

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, StepsOption, WaitOption, WideOption,
                                          console, emit_frame, user_errors)
from polytrace_cli.errors import PolytraceError

# The narrow table's columns, most telling first; flags are shown as one text column.
TABLE_ORDER = ("step", "step_s", "gen_s", "trainer_wait_s", "rollout_s", "reward_s", "update_actor_s", "response_mean", "response_max", "clip_ratio",
               "lambda_tokens", "lambda_makespan", "slot_idle", "flags", "expected_step_s", "top_cause",
               "tool_latency_mean_s", "tool_latency_p99_s", "prefix_cache_hit_ratio", "tokens", "step_time_basis",
               "lambda_tokens_before_balancing", "logged_step_s",
               "old_log_prob_s", "ref_s", "values_s", "adv_s", "update_critic_s", "update_weights_s", "testing_s",
               "save_checkpoint_s", "prompt_mean", "prompt_max", "dp_ranks", "segment", "basis")
FLAG_LABELS = {"validation": "val", "checkpoint": "ckpt", "restart": "restart", "truncated": "trunc",
               "partial": "partial"}


@user_errors
def steps(
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run (see `polytrace runs`).", show_default=False)],
    step_range: StepsOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """One row per step: stage and step seconds, response/prompt length mean and max, clip ratio, tokens,
    DP load λ (tokens and makespan), slot idle, the step's flags, and from `explain` the model's expected
    seconds at the step's workload and, on a slow step, its largest cause."""
    from polytrace_cli.facade import Store

    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    with Store.open(db, read_only=True, wait=wait) as store:
        frame = store.steps(run, step_range)
    if as_json or as_csv:
        emit_frame(frame, as_json=as_json, as_csv=as_csv)
        return
    if not frame.height:
        console.print(f"{run}: no steps{' in ' + step_range if step_range else ''}", highlight=False)
        return
    shown = _for_people(frame)
    # After a restart a step number repeats: the segment tells the rows apart.
    identity = ["segment", "step"] if "segment" in shown.columns else ["step"]
    modes = ", ".join(mode for mode in frame["mode"].unique(maintain_order=True) if mode)
    emit_frame(shown, title=f"{run}: {frame.height} step(s), basis {', '.join(frame['basis'].unique(maintain_order=True))}"
                            + (f", mode {modes}" if modes else ""),
               identity=identity, order=TABLE_ORDER, wide=wide)


def _for_people(frame):
    """The frame without the run column and all-empty columns, its flags joined into one column."""
    import polars as pl

    labels = [pl.when(pl.col(name)).then(pl.lit(label)) for name, label in FLAG_LABELS.items()]
    labels.append(pl.when(pl.col("missing_before") > 0).then(pl.format("gap:{}", pl.col("missing_before"))))
    shown = frame.with_columns(flags=pl.concat_str(labels, separator=",", ignore_nulls=True)).with_columns(
        flags=pl.when(pl.col("flags") == "").then(None).otherwise(pl.col("flags")))
    shown = shown.drop("run", "missing_before", *FLAG_LABELS)
    if shown["basis"].n_unique() == 1:
        shown = shown.drop("basis")
    if shown["segment"].n_unique() == 1:
        shown = shown.drop("segment")
    if shown["mode"].n_unique() == 1:
        shown = shown.drop("mode")  # named in the title
    return shown.select([name for name in shown.columns if shown[name].null_count() < shown.height])
