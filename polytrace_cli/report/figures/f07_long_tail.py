"""F7: long tail, the share of samples still decoding vs decode position, and slot idle per step."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import longtail
from polytrace_cli.report.figures.base import Omitted, empty, runs_of, span_groups

ID = "F7"
TITLE = "Long tail of generation"
CAPTION = ("Left: share of a step's responses still decoding at each decode position, for the run's least and "
           "most idle steps. "
           "Right: slot idle per step, 1 − Σl / (N·max l): the share of decode slots left waiting for the longest "
           "response; runs of very different lengths on step axes of their own.")
FRAMES = ('decoding', 'per_step')
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no response lengths"



def _roles(per_step: pl.DataFrame, run: str) -> list[tuple[str, int, str]]:
    """(role, step, line style) of the run's drawn curves: its least and most idle steps."""
    part = per_step.filter((pl.col("run") == run) & pl.col("slot_idle").is_not_null()).sort("slot_idle", "step")
    if part.height == 0:
        return []
    roles = [("least idle", int(part["step"][0]), "-")]
    if part.height > 1:
        roles.append(("most idle", int(part["step"][-1]), "--"))
    return roles


def selected_steps(per_step: pl.DataFrame) -> list[int]:
    """The steps whose curves are drawn: per run, the steps with the lowest and highest slot idle."""
    runs = per_step["run"].unique().to_list() if per_step.height else []
    return sorted({step for run in runs for _, step, _ in _roles(per_step, run)})


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The longtail analysis' per-step slot idle, and its still-decoding curves for the selected steps."""
    per_step = longtail.per_step(con, run_ids, steps)
    decoding = longtail.still_decoding(con, run_ids, selected_steps(per_step))
    return {"decoding": decoding, "per_step": per_step}


def render(data: dict[str, pl.DataFrame]):
    """Still-decoding curves (one per run × selected step) and slot idle per step per run: one panel, or one
    per group of runs of like length (`span_groups`)."""
    decoding, per_step = data["decoding"], data["per_step"]
    position, share, idle = "position_tokens", "still_decoding_share", "slot_idle"
    if empty(decoding, position, share) and empty(per_step, idle):
        return Omitted("the runs have no per-sample response lengths")
    has_curves = not empty(decoding, position, share)
    has_idle = not empty(per_step, idle)
    series = per_step.group_by("run", "step", maintain_order=True).agg(pl.col(idle).mean()).sort("run", "step") \
        if has_idle else per_step
    groups = span_groups(series.filter(pl.col(idle).is_not_null())) if has_idle else []
    count = int(has_curves) + len(groups)
    if count <= 2:
        figure, axes = style.new_figure(count, 1, width=10, height=4.2)
        axes = list(axes)
    else:
        figure, axes = style.new_grid(count, columns=2, width=10, panel_height=3.8)
    if has_curves:
        left = axes[0]
        runs = runs_of(decoding)
        for run_index, run in enumerate(runs):
            for role, step, linestyle in _roles(per_step, run):
                part = decoding.filter((pl.col("run") == run) & (pl.col("step") == step)).sort(position)
                if part.height:
                    left.plot(part[position], part[share], color=style.colour(run_index), linestyle=linestyle,
                              linewidth=1.4, label=f"{run} step {step} ({role})" if run else f"step {step} ({role})")
        left.set_xlabel("decode position (tokens)")
        left.set_ylabel("share of responses still decoding")
        left.set_ylim(0, 1.02)
        left.set_title("Responses still decoding")
        style.legend(left, loc="upper right")
    if has_idle:
        colours = runs_of(decoding) if has_curves else []
        colours += [run for run in runs_of(series) if run not in colours]
        for right, group in zip(axes[int(has_curves):], groups):
            label = style.step_axis_label(per_step.filter(pl.col("run").is_in(group))["basis"].unique().to_list())
            for run in group:
                part = series.filter(pl.col("run") == run)
                style.plot_steps(right, part["step"], part[idle], color=style.colour(colours.index(run)),
                                 marker=style.point_marker(part.height), linewidth=1.4, label=run)
            right.set_ylim(0, 1)
            right.set_xlabel(label)
            right.set_ylabel("slot idle share")
            title = "Slot idle per step" if len(groups) == 1 else f"Slot idle per step: {', '.join(group)}"
            right.set_title(title if has_curves else
                            f"{title}\n(no per-sample lengths, so no still-decoding curves)")
            style.thin_step_ticks(right, None)
            style.legend(right, loc="lower right")
    return figure
