"""F4: step-time breakdown, stacked bars of stage seconds per step."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import stages as stage_analysis
from polytrace_cli.analyze.semantics import DERIVED
from polytrace_cli.report.figures.base import Omitted, empty, runs_of
from polytrace_cli.analyze.shared_frames import shared

ID = "F4"
TITLE = "Step-time breakdown by stage"
CAPTION = ("Seconds per stage for each step, stacked (bars, or stacked bands beyond 200 steps): every stage the "
           "logs time, weight sync included, then validation and checkpoint saving (added back when the logged step "
           "total leaves them out); the remainder up to the step time (black marks; derived from stage timers when "
           "the log has no step total) is unexplained.")
FRAMES = ('stages',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-step stage timings"

UNEXPLAINED_COLUMN = "unexplained_s"
UNEXPLAINED = UNEXPLAINED_COLUMN.removesuffix("_s")
MAX_BARS = 200
# The palette without its black (black marks the step time), then three more colour-blind-safe colours
# (Paul Tol's muted scheme) so a PPO run's nine stages get nine colours.
STAGE_COLOURS = (*(c for c in style.OKABE_ITO if c != "#000000"), "#44AA99", "#999933", "#AA4499")
# Validation and checkpoint saving are overheads, not stages of the RL step: dark colours of their own.
OVERHEAD_COLOURS = {"testing": "#882255", "save_checkpoint": "#332288"}
UNEXPLAINED_COLOUR = "#BBBBBB"
STEP_TIME_LABEL = "step time"
LEGEND_NAMES = {"testing": "validation", "save_checkpoint": "checkpoint"}


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The stages analysis' per-step stage seconds, with the canonical step time and whether it counts
    validation and checkpoint saving."""
    return {"stages": shared(stage_analysis.per_step, con, run_ids, steps)}


def drawn_stages(per_step: pl.DataFrame) -> pl.DataFrame:
    """(run, segment, step, stage, seconds) of what each run's bars stack, in drawing order: the analysis'
    stages (`stages.stage_columns_of`), the validation and checkpoint timers (`testing`, `save_checkpoint`)
    when the step time counts them (or cannot tell: then the analysis leaves the step's remainder
    unknown and none is drawn), then the unexplained remainder."""
    names = [column.removesuffix("_s") for column in stage_analysis.stage_columns_of(per_step)]
    columns = [pl.col(f"{name}_s").alias(name) for name in names]
    for timer, counts in (("testing", "step_s_counts_testing"), ("save_checkpoint", "step_s_counts_checkpoint")):
        columns.append(pl.when(pl.col(counts).fill_null(True)).then(pl.col(f"{timer}_s")).alias(timer))
    columns.append(pl.col(UNEXPLAINED_COLUMN).alias(UNEXPLAINED))
    order = [*names, *stage_analysis.EXTRA_TIMERS, UNEXPLAINED]
    return (per_step.sort("run", "segment", "step", nulls_last=False).select("run", "segment", "step", *columns)
            .unpivot(index=["run", "segment", "step"], variable_name="stage", value_name="seconds")
            .filter(pl.col("seconds").is_not_null() & (pl.col("seconds") > 0))
            .with_columns(order=pl.col("stage").replace_strict(order, list(range(len(order))))))


def render(data: dict[str, pl.DataFrame]):
    """One panel per run: stacked bars of the stages' seconds, step on x, the logged step time marked."""
    per_step = data["stages"]
    if empty(per_step, "step"):
        return Omitted("the runs have no per-step stage timings (step-aggregate logs such as verl's timing_s/*)")
    long = drawn_stages(per_step)
    if long.height == 0:
        return Omitted("the runs log no stage seconds")
    order = long.sort("order")["stage"].unique(maintain_order=True).to_list()
    stage_names = [stage for stage in order if stage != UNEXPLAINED and stage not in OVERHEAD_COLOURS]
    colours = {stage: STAGE_COLOURS[index % len(STAGE_COLOURS)] for index, stage in enumerate(stage_names)}
    colours |= OVERHEAD_COLOURS | {UNEXPLAINED: UNEXPLAINED_COLOUR}
    runs = runs_of(long)
    figure, axes = style.new_figure(1, len(runs), width=10, height=3.4 * len(runs))
    for ax, run in zip(axes, runs):
        part = long.filter(pl.col("run") == run)
        # After a restart a step can appear in two segments; the later segment's timings are the ones kept.
        table = part.pivot(on="stage", index="step", values="seconds", aggregate_function="last").sort("step").fill_null(0)
        steps = table["step"].to_numpy()
        bottom = np.zeros(len(steps))
        width = 0.85 if len(steps) < 2 else 0.85 * float(np.min(np.diff(steps)))
        for stage in (s for s in order if s in table.columns):
            values = table[stage].to_numpy().astype(float)
            if len(steps) <= MAX_BARS:
                ax.bar(steps, values, bottom=bottom, width=width, color=colours[stage], label=LEGEND_NAMES.get(stage, stage), linewidth=0)
            else:  # thousands of bars draw slowly and unreadably: stacked step bands instead, one polygon per stage
                style.fill_steps(ax, steps, bottom, bottom + values, step="mid", color=colours[stage],
                                 label=LEGEND_NAMES.get(stage, stage), linewidth=0)
            bottom += values
        timed = (per_step.filter((pl.col("run") == run) & pl.col("step_s").is_not_null())
                 .group_by("step").agg(pl.col("step_s").last(), pl.col("step_time_basis").last()).sort("step"))
        if timed.height:
            derived = bool((timed["step_time_basis"] == DERIVED).all())
            ax.scatter(timed["step"].to_numpy(), timed["step_s"].to_numpy(), marker="_", color="black",
                       s=60 if len(steps) <= MAX_BARS else 8, linewidths=1.2, zorder=3,
                       label=f"{STEP_TIME_LABEL} ({DERIVED})" if derived else STEP_TIME_LABEL)
        ax.set_xlabel(style.TRAINER_STEP)
        ax.set_ylabel("seconds")
        ax.set_title(f"{run}: stage seconds per step" if run else "stage seconds per step")
        style.thin_step_ticks(ax, steps)
        handles, labels = ax.get_legend_handles_labels()
        # Stages in stacking order, the step-time mark last (matplotlib lists bars after markers).
        ordered = sorted(zip(handles, labels), key=lambda pair: pair[1].startswith(STEP_TIME_LABEL))
        ax.legend(*zip(*ordered), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
