"""F6: load imbalance, a DP rank × step heat map of load / mean, with token λ, makespan λ and balanced λ."""

from __future__ import annotations

import numpy as np
import polars as pl

from polytrace_cli.analyze import imbalance
from polytrace_cli.analyze.semantics import BALANCED_MAX
from polytrace_cli.analyze.shared_frames import shared
from polytrace_cli.report import style
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F6"
TITLE = "Load imbalance across data-parallel ranks"
CAPTION = ("Heat map: each rank's token load (prompt + response) over the step's mean rank load. "
           "Lines: token λ = max/mean of rank token loads, makespan λ = max/mean of the ranks' longest "
           "responses (what the rollout waits for), and token λ after repartitioning the prompt groups "
           "(balanced). Runs with only verl's global_seqlen metrics have token λ lines and no heat map; when verl "
           "balanced the batch (trainer.balance_batch), token λ is the busiest rank after balancing, which sets the "
           "time, with the λ before balancing beside it.")
FRAMES = ('ranks', 'steps')
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no per-rank samples and no verl global_seqlen metrics"


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The imbalance analysis' per step × rank loads and per-step λ."""
    return {"ranks": imbalance.per_rank(con, run_ids, steps),
            "steps": shared(imbalance.per_step, con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """Per run, stacked: a heat map (rank rows, step columns) when the run has per-rank samples, then the
    λ lines. No panel is drawn without data."""
    ranks, per_step = data["ranks"], data["steps"]
    has_ranks = not empty(ranks, "load_over_mean")
    has_lines = not empty(per_step, "lambda")
    if not has_ranks and not has_lines:
        return Omitted("the runs have no per-rank samples and no verl global_seqlen metrics")
    runs = list(dict.fromkeys([*(runs_of(ranks) if has_ranks else []), *(runs_of(per_step) if has_lines else [])]))
    heat_runs = set(runs_of(ranks)) if has_ranks else set()
    rows = sum(2 if run in heat_runs else 1 for run in runs)
    figure, axes = style.new_figure(1, rows, width=10, height=2.5 * rows + 0.4)
    panels = iter(axes)
    limit = max(0.05, float(np.nanmax(np.abs(ranks["load_over_mean"].to_numpy() - 1.0)))) if has_ranks else 1.0
    heat_axes, image = [], None
    for run in runs:
        step_range = None
        if run in heat_runs:
            heat_ax = next(panels)
            part = ranks.filter(pl.col("run") == run)
            grid = part.pivot(on="step", index="dp_rank", values="load_over_mean", aggregate_function="mean").sort("dp_rank")
            step_columns = sorted(grid.columns[1:], key=int)
            steps = np.array([int(s) for s in step_columns])
            # One column per step from first to last, so missing steps show as blank columns, not stretched ones.
            full = np.arange(steps.min(), steps.max() + 1)
            matrix = np.full((grid.height, full.size), np.nan)
            matrix[:, steps - steps.min()] = grid.select(step_columns).to_numpy().astype(float)
            image = heat_ax.imshow(matrix, aspect="auto", cmap=style.DIVERGING_CMAP, vmin=1 - limit, vmax=1 + limit,
                                   interpolation="nearest", origin="lower",
                                   extent=(full.min() - 0.5, full.max() + 0.5, -0.5, matrix.shape[0] - 0.5))
            heat_ax.grid(False)
            heat_ax.set_ylabel("DP rank")
            ranks_shown = grid["dp_rank"].to_list()
            tick_every = max(1, len(ranks_shown) // 8)
            heat_ax.set_yticks(range(0, len(ranks_shown), tick_every), [str(r) for r in ranks_shown[::tick_every]])
            heat_ax.set_title(f"{run}: rank token load / mean")
            style.thin_step_ticks(heat_ax, None)
            heat_axes.append(heat_ax)
            step_range = (full.min() - 0.5, full.max() + 0.5)
        line_ax = next(panels)
        lines = per_step.filter(pl.col("run") == run).sort("step") if has_lines else per_step.clear()
        if lines.height:
            steps = lines["step"].to_numpy()
            after_balancing = bool((lines["lambda_basis"] == BALANCED_MAX).any())
            style.plot_steps(line_ax, steps, lines["lambda"], color=style.colour(3), linewidth=1.4,
                             label="token λ after verl's balancing" if after_balancing else "token λ")
            if after_balancing and lines["lambda_before_balancing"].drop_nulls().len():
                style.plot_steps(line_ax, steps, lines["lambda_before_balancing"], color=style.colour(5),
                                 linewidth=1.0, linestyle="-.", label="token λ before balancing")
            if lines["makespan_lambda"].drop_nulls().len():
                style.plot_steps(line_ax, steps, lines["makespan_lambda"], color=style.colour(0), linewidth=1.4,
                                 linestyle="--", label="makespan λ")
            if lines["lambda_balanced"].drop_nulls().len() and not after_balancing:
                style.plot_steps(line_ax, steps, lines["lambda_balanced"], color=style.colour(2), linewidth=1.2,
                                 linestyle=":", label="token λ balanced")
            line_ax.axhline(1.0, color="#777777", linewidth=0.8, linestyle=":")
            basis = lines["saving_basis"].drop_nulls()
            sets_time = "makespan λ" if basis.len() and basis[0] == "makespan" else "token λ"
            line_ax.set_title(f"{run}: imbalance per step ({sets_time} sets the step time)")
            line_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        else:
            line_ax.set_title(f"{run}: no per-step λ")
        line_ax.set_xlabel(style.step_axis_label(lines["basis"].unique().to_list() if lines.height else []))
        line_ax.set_ylabel("λ (max / mean)")
        style.thin_step_ticks(line_ax, None)
        if step_range is not None:
            line_ax.set_xlim(*step_range)
    if image is not None:
        style.add_colorbar(figure, image, heat_axes, label="load / mean load", shrink=0.6, aspect=40)
    return figure
