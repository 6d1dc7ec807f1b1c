"""Figures that fit their data: runs of very different lengths on step axes of their own, and no text of a
figure (tick labels, titles, axis labels, point labels, legends) overlapping another, checked with
matplotlib's text extents once the figure is laid out as it is painted."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from polytrace_cli.analyze import lengths, longtail
from polytrace_cli.report.figures import f02_response_by_step, f05_step_time, f07_long_tail
from polytrace_cli.report.figures.base import span_groups


def drawn_texts(figure) -> list[tuple[Text, object]]:
    """Every text the laid-out figure draws, with its extent in pixels: tick labels only of ticks inside their
    axis' view (matplotlib keeps others it does not draw), a point label without its connecting line."""
    FigureCanvasAgg(figure)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    undrawn = set()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            slack = 1e-9 * abs(high - low)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not low - slack <= tick.get_loc() <= high + slack:
                    undrawn |= {id(tick.label1), id(tick.label2)}
    out = []
    for text in figure.findobj(Text):
        if id(text) in undrawn or not text.get_visible() or not text.get_text().strip():
            continue
        box = Text.get_window_extent(text, renderer)
        if box.width > 0 and box.height > 0:
            out.append((text, box))
    return out


def assert_texts_apart(figure) -> None:
    """No two drawn texts overlap, and each lies inside the figure."""
    texts = drawn_texts(figure)
    width, height = figure.canvas.get_width_height()
    for index, (text, box) in enumerate(texts):
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, text.get_text()
        for other, other_box in texts[index + 1:]:
            assert not box.overlaps(other_box), (text.get_text(), other.get_text())


def _length_rows(run: str, steps: range, mean: float) -> list[dict]:
    return [{"run": run, "step": s, "kind": "response", "basis": "samples", "count": 8, "mean_tokens": mean,
             "min_tokens": mean / 4, "p50_tokens": mean, "p90_tokens": 1.5 * mean, "p99_tokens": 2 * mean,
             "max_tokens": 2.5 * mean} for s in steps]


def test_runs_of_very_different_lengths_get_their_own_step_axes():
    long = _length_rows("long", range(300), 1000.0)
    short = _length_rows("short", range(4), 800.0) + _length_rows("shorter", range(3), 600.0)
    frame = pl.DataFrame(long + short, schema=lengths.PER_STEP_COLUMNS)
    assert span_groups(frame) == [["long"], ["short", "shorter"]]
    figure = f02_response_by_step.render({"per_step": frame})
    # One panel per group: the 3- and 4-step traces span their own axis, not a corner of the 300-step one.
    assert len(figure.axes) == 2
    assert figure.axes[1].get_xlim()[1] - figure.axes[1].get_xlim()[0] < 10
    assert figure.axes[0].get_xlim()[1] > 290
    assert_texts_apart(figure)
    alike = pl.DataFrame(_length_rows("a", range(300), 1000.0) + _length_rows("b", range(100), 900.0),
                         schema=lengths.PER_STEP_COLUMNS)
    assert span_groups(alike) == [["a", "b"]] and len(f02_response_by_step.render({"per_step": alike}).axes) == 1


def test_slot_idle_of_a_short_trace_is_not_squashed_beside_a_long_run():
    rows = [{"run": run, "step": s, "basis": "samples", "estimate": False, "batches": 2, "slot_idle": 0.3 + 0.01 * s,
             "straggler_share": None, "max_slot_idle": None}
            for run, count in (("long", 200), ("trace", 5)) for s in range(count)]
    per_step = pl.DataFrame(rows, schema=longtail.PER_STEP_COLUMNS)
    decoding = pl.DataFrame(schema=longtail.STILL_DECODING_COLUMNS)
    figure = f07_long_tail.render({"decoding": decoding, "per_step": per_step})
    assert len(figure.axes) == 2 and [ax.get_title() for ax in figure.axes] == [
        "Slot idle per step: long\n(no per-sample lengths, so no still-decoding curves)",
        "Slot idle per step: trace\n(no per-sample lengths, so no still-decoding curves)"]
    assert figure.axes[1].get_xlim()[1] < 10
    assert_texts_apart(figure)


def _series(run: str, step_seconds: list[float], reasons: dict[int, str]) -> list[dict]:
    median = float(np.median(step_seconds))
    mad = float(np.median(np.abs(np.array(step_seconds) - median))) or 1.0
    return [{"run": run, "segment": 0, "step": step, "step_s": seconds, "gen_s": seconds / 3,
             "robust_z": abs(seconds - median) / (1.4826 * mad), "reasons": reasons.get(step, ""),
             "outlier": abs(seconds - median) / (1.4826 * mad) > 3.5,
             "slow_outlier": abs(seconds - median) / (1.4826 * mad) > 3.5 and seconds > median}
            for step, seconds in enumerate(step_seconds)]


def test_f5_labels_at_the_axes_edges_clear_the_ticks_and_the_legend():
    """Slow steps at the very start (a warm-up of 400 s over a 35 s step) and at the last steps, with long
    labels and a legend outside the axes: every label stays inside its axes, clear of the tick labels, the
    legend and each other, once laid out."""
    warm = [420.0, 400.0, 380.0] + [35.0 + 0.3 * (s % 4) for s in range(250)]
    checkpointed = [11.0 + 0.2 * (s % 3) for s in range(330)]
    for step in range(9, 330, 10):
        checkpointed[step] = 38.0 + 0.1 * step % 2
    reasons = {step: "testing,checkpoint" for step in range(9, 330, 10)}
    series = pl.DataFrame(_series("warm", warm, {}) + _series("checkpointed", checkpointed, reasons))
    figure = f05_step_time.render({"series": series})
    labels = [text.get_text() for ax in figure.axes for text in ax.texts]
    assert any(label.startswith("anomaly") for label in labels) and len(labels) >= 4
    assert_texts_apart(figure)
