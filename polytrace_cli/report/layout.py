"""The report's figure layout: each panel placed once, from one measurement of what surrounds it.

A report figure is a grid of panels (`Figure.subplots`), each with decorations around its axes box:
tick labels, axis labels, a title, a legend outside the box. Some panels have a colour bar at their
right (`add_colorbar`), and the figure may carry a note at the top (`Figure.suptitle`).

`MeasuredGrid` measures every decoration once, at a provisional placement, with
`Axes.get_tightbbox`, and solves the grid:

    column c's width   = widest left decoration in c + panel width + widest right decoration in c
                         (+ the colour bars of panels that end in c)
    row r's height     = tallest top decoration in r + panel height + tallest bottom decoration in r
    panel width/height = what the figure has left, shared equally by the columns/rows

with `PAD` inches between the decorations and the figure's edge and `GAP` inches between neighbours.
matplotlib's constrained layout reaches much the same result by measuring every decoration in two
passes before the draw measures them again; on a report's dozen figures that cost about 0.8 s of CPU,
a third of the time their painting took. A decoration measured at the provisional placement can
change a little at the final one (an axis one tick longer), so each is given `SLACK` inches more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.layout_engine import LayoutEngine
from matplotlib.transforms import Bbox

PAD = 0.08  # inches between a decoration and the figure's edge
GAP = 0.14  # inches between neighbouring decorations: panel to panel, panel to colour bar
SLACK = 0.04  # inches added to each measured decoration
MIN_PANEL = 0.3  # inches: panels never get smaller, even when their decorations then overlap
# Before measuring, panels are placed as if decorated this much (left, bottom, right, top, inches), so the
# measured ones are close to the final ones.
PROVISIONAL = (0.75, 0.55, 0.3, 0.35)


@dataclass
class ColourBar:
    """A colour bar's axes, the panels it belongs to, its length as a share of theirs and its length / width."""

    axes: Axes
    parents: list[Axes]
    shrink: float = 1.0
    aspect: float = 20.0


@dataclass
class Decorations:
    """Inches each side of a box taken by what is drawn around it."""

    left: float = 0.0
    bottom: float = 0.0
    right: float = 0.0
    top: float = 0.0


@dataclass
class _Grid:
    """The solved sizes: each column's and row's decorations and the panel width and height, in inches."""

    left: list[float]
    right: list[float]
    top: list[float]
    bottom: list[float]
    bar_block: list[float] = field(default_factory=list)


class MeasuredGrid(LayoutEngine):
    """Lays a report figure out once, on its first draw (see the module docstring)."""

    _adjust_compatible = False
    _colorbar_gridspec = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.bars: list[ColourBar] = []
        self._done_for: tuple[float, float] | None = None

    def set(self, **kwargs) -> None:
        """The engine has no parameters; setting any is an error."""
        if kwargs:
            raise TypeError(f"MeasuredGrid takes no parameters: {sorted(kwargs)}")

    def execute(self, fig: Figure) -> None:
        """Place the panels, colour bars and top notes; done again only when the figure's size changed."""
        size = tuple(float(v) for v in fig.get_size_inches())
        if self._done_for == size:
            return
        panels = [ax for ax in fig.axes if ax.get_subplotspec() is not None and ax.get_in_layout()]
        if not panels:
            return
        grid_spec = panels[0].get_subplotspec().get_gridspec()
        panels = [ax for ax in panels if ax.get_subplotspec().get_gridspec() is grid_spec]
        shape = grid_spec.get_geometry()
        height = size[1]

        notes = [text for text in fig.texts if text.get_visible() and text.get_text()]
        for text in notes:
            text.set_horizontalalignment("center")
            text.set_verticalalignment("top")
        renderer = fig._get_renderer()  # what matplotlib's own layout engines measure with
        note_height = sum(_inches(fig, text.get_window_extent(renderer)).height for text in notes)
        top_band = note_height + GAP if notes else 0.0

        provisional = Decorations(*PROVISIONAL)
        self._place(fig, panels, shape, {ax: provisional for ax in panels}, {}, top_band)
        measured = {ax: _decorations(fig, ax, renderer) for ax in panels}
        bar_sizes = {id(bar.axes): _decorations(fig, bar.axes, renderer) for bar in self.bars}
        self._place(fig, panels, shape, measured, bar_sizes, top_band)

        y = 1 - PAD / height
        for text in notes:
            text.set_position((0.5, y))
            y -= _inches(fig, text.get_window_extent(renderer)).height / height
        self._done_for = size

    def _place(self, fig: Figure, panels: list[Axes], shape: tuple[int, int], around: dict[Axes, Decorations],
               bar_sizes: dict[int, Decorations], top_band: float) -> None:
        nrows, ncols = shape
        width, height = (float(v) for v in fig.get_size_inches())
        grid = _Grid([0.0] * ncols, [0.0] * ncols, [0.0] * nrows, [0.0] * nrows, [0.0] * ncols)
        cells = {ax: ax.get_subplotspec() for ax in panels}
        for ax, cell in cells.items():
            sides = around[ax]
            first_col, last_col = cell.colspan.start, cell.colspan.stop - 1
            first_row, last_row = cell.rowspan.start, cell.rowspan.stop - 1
            grid.left[first_col] = max(grid.left[first_col], sides.left)
            grid.right[last_col] = max(grid.right[last_col], sides.right)
            grid.top[first_row] = max(grid.top[first_row], sides.top)
            grid.bottom[last_row] = max(grid.bottom[last_row], sides.bottom)

        panel_height = max(MIN_PANEL, (height - 2 * PAD - top_band - sum(grid.top) - sum(grid.bottom)
                                       - GAP * (nrows - 1)) / nrows)
        row_tops, y = [], height - PAD - top_band
        for row in range(nrows):
            y -= grid.top[row]
            row_tops.append(y)
            y -= panel_height + grid.bottom[row] + GAP

        bar_places = []  # (bar, width, length, vertical middle, column it sits right of), in inches
        for bar in self.bars:
            parent_cells = [cells[ax] for ax in bar.parents if ax in cells]
            if not parent_cells:
                continue
            top = max(row_tops[cell.rowspan.start] for cell in parent_cells)
            bottom = min(row_tops[cell.rowspan.stop - 1] - panel_height for cell in parent_cells)
            length = bar.shrink * (top - bottom)
            column = max(cell.colspan.stop - 1 for cell in parent_cells)
            bar_places.append((bar, length / bar.aspect, length, (top + bottom) / 2, column))
            sides = bar_sizes.get(id(bar.axes), Decorations(right=PROVISIONAL[2]))
            grid.bar_block[column] = max(grid.bar_block[column], GAP + length / bar.aspect + sides.right)

        panel_width = max(MIN_PANEL, (width - 2 * PAD - sum(grid.left) - sum(grid.right) - sum(grid.bar_block)
                                      - GAP * (ncols - 1)) / ncols)
        col_lefts, x = [], PAD
        for col in range(ncols):
            x += grid.left[col]
            col_lefts.append(x)
            x += panel_width + grid.right[col] + grid.bar_block[col] + GAP

        for ax, cell in cells.items():
            x0 = col_lefts[cell.colspan.start]
            x1 = col_lefts[cell.colspan.stop - 1] + panel_width
            y1 = row_tops[cell.rowspan.start]
            y0 = row_tops[cell.rowspan.stop - 1] - panel_height
            ax.set_position(Bbox.from_extents(x0 / width, y0 / height, x1 / width, y1 / height))

        for bar, bar_width, length, middle, column in bar_places:
            x0 = col_lefts[column] + panel_width + grid.right[column] + GAP
            y0 = middle - length / 2
            bar.axes.set_position(Bbox.from_bounds(x0 / width, y0 / height, bar_width / width, length / height))


def _inches(fig: Figure, box: Bbox) -> Bbox:
    return box.transformed(fig.dpi_scale_trans.inverted())


def _decorations(fig: Figure, ax: Axes, renderer) -> Decorations:
    """How far the axes' tight box (ticks, labels, title, legend) reaches beyond its axes box, plus SLACK."""
    tight = ax.get_tightbbox(renderer, for_layout_only=True)
    if tight is None:
        return Decorations()
    box, tight = _inches(fig, ax.get_window_extent(renderer)), _inches(fig, tight)
    return Decorations(left=max(0.0, box.x0 - tight.x0) + SLACK, bottom=max(0.0, box.y0 - tight.y0) + SLACK,
                       right=max(0.0, tight.x1 - box.x1) + SLACK, top=max(0.0, tight.y1 - box.y1) + SLACK)


def add_colorbar(fig: Figure, mappable, parents: list[Axes], *, label: str | None = None, shrink: float = 1.0,
                 aspect: float = 20.0):
    """A colour bar for `mappable` to the right of `parents`, `shrink` times their height and `aspect` times
    longer than wide, placed by the figure's MeasuredGrid; returns the Colorbar."""
    engine = fig.get_layout_engine()
    if not isinstance(engine, MeasuredGrid):
        return fig.colorbar(mappable, ax=parents, label=label, shrink=shrink, aspect=aspect)
    cax = fig.add_axes((0.9, 0.1, 0.02, 0.8))
    engine.bars.append(ColourBar(cax, list(parents), shrink, aspect))
    return fig.colorbar(mappable, cax=cax, label=label)
