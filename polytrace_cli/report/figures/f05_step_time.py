"""F5: step-time fluctuation, step and gen time over steps with outliers and max/min marked."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import stages
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F5"
TITLE = "Step-time fluctuation"
CAPTION = ("Step and generation seconds per trainer step (the step's wall time: validation and checkpoint added "
           "back when the logged step total leaves them out, derived from stage timers without one). Marked: steps a robust rule calls slow (robust z > "
           "3.5 above the run's median step time). Triangles are explained overheads (validation, checkpoint); "
           "crosses are anomalies (no such reason). The slowest few are labelled.")
FRAMES = ('series',)
# Why a run without this figure's data is left out of it.
LEFT_OUT = "no step time logged"



def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The steps analysis' step/gen time series with outlier flags."""
    return {"series": stages.series(con, run_ids, steps)}


TOP_LABELS = 4
REASON_NAMES = {"testing": "validation", "checkpoint": "checkpoint", "truncated_line": "truncated log line",
                "restart": "restart", "validation_only": "validation only"}


def _label(reasons: str, z: float) -> str:
    named = [REASON_NAMES.get(reason, reason) for reason in reasons.split(",") if reason]
    return f"{' + '.join(named) if named else 'anomaly'} (z {z:.1f})"


def render(data: dict[str, pl.DataFrame]):
    """One panel per run: step and gen seconds, slow steps marked (explained overheads apart from anomalies)
    and the slowest few labelled without overlap."""
    series = data["series"]
    step_col, gen_col = "step_s", "gen_s"
    if empty(series, step_col):
        return Omitted("the runs log no step time (step-aggregate logs such as verl's timing_s/step)")
    runs = [r for r in runs_of(series) if series.filter(pl.col("run") == r)[step_col].drop_nulls().len()]
    figure, axes = style.new_figure(1, len(runs), width=10, height=3.4 * len(runs))
    for ax, run in zip(axes, runs):
        part = series.filter((pl.col("run") == run) & pl.col(step_col).is_not_null()).sort("step")
        steps = part["step"].to_numpy()
        style.plot_steps(ax, steps, part[step_col].to_numpy(), color=style.colour(0), linewidth=1.4, label="step")
        if part[gen_col].drop_nulls().len():
            style.plot_steps(ax, steps, part[gen_col].to_numpy(), color=style.colour(1), linewidth=1.2, label="gen")
        slow = part.filter(pl.col("slow_outlier")).with_columns(
            explained=pl.col("reasons").str.contains(r"\b(testing|checkpoint)\b"))
        explained, anomalies = slow.filter(pl.col("explained")), slow.filter(~pl.col("explained"))
        if explained.height:
            ax.scatter(explained["step"], explained[step_col], marker="^", s=40, color="#777777", zorder=5,
                       label="slow: validation / checkpoint")
        if anomalies.height:
            ax.scatter(anomalies["step"], anomalies[step_col], marker="x", s=50, color=style.colour(3), zorder=5,
                       label="slow: anomaly")
        top = slow.sort("robust_z", descending=True).head(TOP_LABELS)
        # Head room above the data for the label rows.
        ax.set_ylim(0, part[step_col].max() * (1.45 if top.height else 1.1))
        names = [_label(reasons, z) for reasons, z in zip(top["reasons"], top["robust_z"])]
        style.label_points(ax, top["step"].to_list(), top[step_col].to_list(), names)
        high, low = part[step_col].max(), part[step_col].min()
        ratio = f"max/min = {high / low:.2f}" if low and low > 0 else "max/min undefined"
        ax.set_title(f"{run}: step and gen time (max {high:.1f} s, min {low:.1f} s, {ratio})")
        ax.set_xlabel(style.TRAINER_STEP)
        ax.set_ylabel("seconds")
        style.thin_step_ticks(ax, None)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
