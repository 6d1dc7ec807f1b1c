"""F5: step-time fluctuation, step and gen time over steps with outliers and max/min marked."""

from __future__ import annotations

import polars as pl

from polytrace_cli.report import style
from polytrace_cli.analyze import stages
from polytrace_cli.report.figures.base import Omitted, empty, runs_of

ID = "F5"
TITLE = "Step-time fluctuation"
CAPTION = ("Step and generation seconds per step. Crosses mark outlier steps (robust z-score > 3.5) labelled "
           "with their reason; the longest and shortest step are annotated with max/min.")
FRAMES = ('series',)

MAX_PANELS = 4


def frames(con, run_ids, steps) -> dict[str, pl.DataFrame]:
    """The steps analysis' step/gen time series with outlier flags."""
    return {"series": stages.series(con, run_ids, steps)}


def render(data: dict[str, pl.DataFrame]):
    """One panel per run: step and gen seconds, outliers marked with their reason, max and min annotated."""
    series = data["series"]
    step_col, gen_col = "step_s", "gen_s"
    if empty(series, step_col):
        return Omitted("the runs log no step time (step-aggregate logs such as verl's timing_s/step)")
    runs = [r for r in runs_of(series) if series.filter(pl.col("run") == r)[step_col].drop_nulls().len()][:MAX_PANELS]
    figure, axes = style.new_figure(1, len(runs), width=10, height=3.4 * len(runs))
    for ax, run in zip(axes, runs):
        part = series.filter((pl.col("run") == run) & pl.col(step_col).is_not_null()).sort("step")
        steps = part["step"].to_numpy()
        style.plot_steps(ax, steps, part[step_col].to_numpy(), color=style.colour(0), linewidth=1.4, label="step")
        if part[gen_col].drop_nulls().len():
            style.plot_steps(ax, steps, part[gen_col].to_numpy(), color=style.colour(1), linewidth=1.2, label="gen")
        if True:
            outliers = part.filter(pl.col("outlier"))
            if outliers.height:
                ax.scatter(outliers["step"], outliers[step_col], marker="x", s=50, color=style.colour(3),
                           zorder=5, label="outlier")
                reasons = outliers["reasons"].to_list()
                for step, seconds, reason in zip(outliers["step"], outliers[step_col], reasons):
                    ax.annotate(reason or "unexplained", (step, seconds), textcoords="offset points", xytext=(4, 6),
                                fontsize=7, color=style.colour(3))
        high, low = part[step_col].max(), part[step_col].min()
        ratio = f"max/min = {high / low:.2f}" if low and low > 0 else "max/min undefined"
        ax.text(0.01, 0.97, f"max {high:.1f} s, min {low:.1f} s, {ratio}", transform=ax.transAxes,
                va="top", fontsize=8, color="#333333")
        ax.set_xlabel(style.TRAINER_STEP)
        ax.set_ylabel("seconds")
        ax.set_title(f"{run}: step and gen time" if run else "step and gen time")
        style.thin_step_ticks(ax, None)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return figure
