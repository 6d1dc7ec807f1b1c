"""F10: DAPO filtering, kept share per generation batch and generation batches per trainer step."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import filtering
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F10"
TITLE = "DAPO dynamic-sampling filter"
CAPTION = ("Left: share of a generation batch's prompts kept by the filter (kept / prompt_count), by workload "
           "step (one rollout call); the line joins the mean per workload step. Right: generation batches needed "
           "to fill each trainer step. Several workload steps feed one trainer step.")
MAX_BARS = 200
FRAMES = ('batches', 'trainer_steps')
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no DAPO filter batches"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The filtering analysis' per generation batch and per trainer step frames."""
    return {"batches": filtering.per_batch(con, run_ids, steps),
            "trainer_steps": filtering.per_trainer_step(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Two panels, one colour per run."""
    batches, trainer = data["batches"], data["trainer_steps"]
    kept, per_step, step_col = "kept_share", "batches", "trainer_step"
    if empty(batches, kept) and empty(trainer, per_step):
        return Omitted("the runs have no DAPO filter batches (dapo_filter_indices traces)")
    has_kept = not empty(batches, kept)
    has_steps = not empty(trainer, per_step)
    figure, axes = style.new_figure(int(has_kept) + int(has_steps), 1, width=10,
                                    height=4.0)
    if has_kept:
        left = axes[0]
        for index, run in enumerate(runs_of(batches)):
            # Several generation batches can share a workload step: each is a point, the line joins their means.
            part = batches.filter(pl.col("run") == run).sort("workload_step", "gen_batch_index")
            mean = part.group_by("workload_step").agg(pl.col(kept).mean()).sort("workload_step")
            left.scatter(part["workload_step"], part[kept], s=10, color=style.colour(index), alpha=0.6)
            style.plot_steps(left, mean["workload_step"], mean[kept], color=style.colour(index), linewidth=1.0,
                             label=run)
        left.set_ylim(0, 1.02)
        left.set_xlabel(style.WORKLOAD_STEP)
        left.set_ylabel("kept share of prompts")
        left.set_title("Kept share per generation batch")
        style.thin_step_ticks(left, None)
        style.legend(left, loc="lower right")
    if has_steps:
        right = axes[-1]
        runs = runs_of(trainer)
        width = 0.8 / len(runs)
        for index, run in enumerate(runs):
            part = trainer.filter(pl.col("run") == run).sort(step_col)
            if part.height <= MAX_BARS:
                right.bar(part[step_col].to_numpy() + (index - (len(runs) - 1) / 2) * width, part[per_step],
                          width=width, color=style.colour(index), label=run)
            else:  # hundreds of bars alias into stripes: a step line instead
                right.step(part[step_col].to_numpy(), part[per_step].to_numpy(), where="mid", linewidth=1.2,
                           color=style.colour(index), label=run)
        right.set_ylim(0, None)
        right.set_xlabel(style.TRAINER_STEP)
        right.set_ylabel("generation batches")
        right.set_title("Generation batches per trainer step")
        right.xaxis.get_major_locator().set_params(integer=True)
        right.yaxis.get_major_locator().set_params(integer=True)
        if len(runs) > 1:
            right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
