"""The report's figure layout (`report.layout.MeasuredGrid`): after painting, every decoration is inside the
figure and no panel's decorations overlap another panel, a colour bar or the note at the top."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from polytrace_cli.report import style
from polytrace_cli.report.layout import MeasuredGrid


def painted_boxes(figure):
    """Paint the figure; return its size in pixels, each panel's and colour bar's tight box and the notes' boxes."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    panels = [ax for ax in figure.axes if ax.get_subplotspec() is not None]
    bars = [bar.axes for bar in figure.get_layout_engine().bars]
    boxes = {ax: ax.get_tightbbox(renderer, for_layout_only=True) for ax in [*panels, *bars]}
    notes = [text.get_window_extent(renderer) for text in figure.texts]
    return (canvas.get_width_height(), panels, bars, boxes, notes)


def overlap(a, b, tolerance: float = 1.0) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance


def assert_laid_out(figure):
    (width, height), panels, bars, boxes, notes = painted_boxes(figure)
    for ax, box in boxes.items():
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, (ax.get_title(), box)
    for a, b in itertools.combinations([*panels, *bars], 2):
        assert not overlap(boxes[a], boxes[b]), (a.get_title(), b.get_title())
    for note, ax in itertools.product(notes, [*panels, *bars]):
        assert not overlap(note, boxes[ax]), ax.get_title()
    for note in notes:
        assert note.x0 >= -1 and note.x1 <= width + 1 and note.y1 <= height + 1


def test_a_grid_with_wide_labels_legends_outside_and_a_note_fits():
    figure, axes = style.new_figure(3, 2, width=10, height=6)
    for index, ax in enumerate(axes):
        ax.plot(np.arange(10), np.arange(10) * 10 ** index, label=f"a long run name number {index}")
        ax.set_ylabel("tokens per second per rank")
        ax.set_xlabel("trainer step")
        ax.set_title(f"panel {index}\nsecond line")
        if index % 3 == 2:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle("Not shown (no per-rank samples): one, two, three")
    assert_laid_out(figure)
    # Columns share the width: every panel of the grid is as wide as the others.
    widths = {round(ax.get_position().width, 6) for ax in axes}
    assert len(widths) == 1


def test_colour_bars_sit_right_of_their_panels_and_legends():
    figure, axes = style.new_figure(1, 3, width=10, height=8)
    image = axes[0].imshow(np.arange(12.0).reshape(3, 4), aspect="auto")
    axes[2].imshow(np.arange(12.0).reshape(3, 4), aspect="auto")
    axes[1].plot([0, 1], [1, 2], label="token λ balanced over ranks")
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    bar = style.add_colorbar(figure, image, [axes[0], axes[2]], label="load / mean load", shrink=0.6, aspect=40)
    assert_laid_out(figure)
    renderer = figure.canvas.get_renderer()
    legend = axes[1].get_legend().get_window_extent(renderer)
    assert bar.ax.get_window_extent(renderer).x0 > legend.x1  # the bar is right of the widest right decoration
    top, bottom = axes[0].get_position().y1, axes[2].get_position().y0
    position = bar.ax.get_position()
    assert position.height == pytest.approx(0.6 * (top - bottom))
    assert (position.y0 + position.y1) / 2 == pytest.approx((top + bottom) / 2)


def test_removed_cells_and_one_panel_figures():
    figure, panels = style.new_grid(4, columns=3)
    for ax in panels:
        ax.hexbin(np.geomspace(10, 5000, 200), np.geomspace(50, 9000, 200), gridsize=10, xscale="log", yscale="log")
        style.plain_log_ticks(ax, "x", "y")
    assert_laid_out(figure)
    figure, (ax,) = style.new_figure()
    ax.plot([1, 2], [1_000_000, 2_000_000])
    assert_laid_out(figure)


def test_the_layout_is_done_once_and_again_when_the_size_changes():
    figure, (ax,) = style.new_figure(width=6, height=3)
    ax.set_ylabel("seconds")
    FigureCanvasAgg(figure).draw()
    first = ax.get_position().frozen()
    ax.set_position([0.5, 0.5, 0.1, 0.1])
    FigureCanvasAgg(figure).draw()
    assert ax.get_position().bounds == pytest.approx((0.5, 0.5, 0.1, 0.1))  # laid out already: left alone
    figure.set_size_inches(8, 3)
    FigureCanvasAgg(figure).draw()
    assert ax.get_position().bounds != pytest.approx(first.bounds)
    assert_laid_out(figure)


def test_the_engine_takes_no_parameters():
    with pytest.raises(TypeError):
        MeasuredGrid().set(pad=1)
