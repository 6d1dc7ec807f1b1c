"""F10: DAPO filtering, kept share per generation batch and generation batches per trainer step."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import filtering
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F10"
TITLE = "DAPO dynamic-sampling filter"
CAPTION = ("Left: share of a generation batch's prompts kept by the filter (kept / prompt_count). "
           "Right: generation batches needed to fill each trainer step.")
MAX_BARS = 200
FRAMES = ('batches', 'trainer_steps')


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
    figure, axes = style.new_figure(int(has_kept) + int(has_steps), 1, width=11 if has_kept and has_steps else 6,
                                    height=4.0)
    if has_kept:
        left = axes[0]
        for index, run in enumerate(runs_of(batches)):
            part = batches.filter(pl.col("run") == run).with_row_index("sequence")
            left.plot(part["sequence"], part[kept], color=style.colour(index), linewidth=1.0, label=run,
                      marker=style.point_marker(part.height), markersize=3)
        left.set_ylim(0, 1.02)
        left.set_xlabel("generation batch (in order)")
        left.set_ylabel("kept share of prompts")
        left.set_title("Kept share per generation batch")
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
        right.set_xlabel("trainer step")
        right.set_ylabel("generation batches")
        right.set_title("Generation batches per trainer step")
        right.xaxis.get_major_locator().set_params(integer=True)
        if len(runs) > 1:
            right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
