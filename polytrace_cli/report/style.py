"""One look for every figure: Agg backend, readable labels, the Okabe–Ito colour-blind-safe palette."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from polytrace_cli.report.layout import MeasuredGrid, add_colorbar  # noqa: E402, F401 - figures add colour bars through style

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = [
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
]
# zlib level of the figures' PNGs. For the `make demo` store's 9 figures, without alpha: level 3 took
# 0.12 s and 765 KB, level 6 (Pillow's default) 0.17 s and 728 KB; matplotlib's RGBA PNG 0.20 s and 801 KB.
PNG_COMPRESSION = 3
SEQUENTIAL_CMAP = "viridis"
DIVERGING_CMAP = "PuOr_r"

RC = {
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO),
    "svg.fonttype": "none",
}


def colour(index: int) -> str:
    """The palette colour for the index-th series (cycling)."""
    return OKABE_ITO[index % len(OKABE_ITO)]


def new_figure(ncols: int = 1, nrows: int = 1, *, width: float = 9.0, height: float = 4.2) -> tuple[Figure, np.ndarray]:
    """A figure in the report style and its axes as a flat array (not attached to pyplot's state), laid out by
    `layout.MeasuredGrid` when first painted; colour bars are added with `add_colorbar`."""
    with matplotlib.rc_context(RC):
        figure = Figure(figsize=(width, height), layout=MeasuredGrid())
        axes = figure.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        _style_axes(ax)
    return figure, axes.ravel()


def save_png(figure: Figure, path) -> None:
    """Write the figure as a PNG at its own dpi in one drawing pass. `Figure.savefig` draws a figure that
    has a layout engine twice (once to lay it out, once to paint it); the Agg canvas lays it out while
    painting, and the pixels are the same. An opaque figure (all of ours) is written without its alpha
    channel, at zlib level PNG_COMPRESSION: the same pixels as matplotlib's own PNG, in a smaller file,
    encoded in about 60% of the time. The figure keeps its own canvas afterwards,
    so the Agg renderer's pixel buffer is freed once written."""
    from PIL import Image

    plain_labels(figure)
    canvas = figure.canvas
    try:
        agg = FigureCanvasAgg(figure)
        agg.draw()
        rgba = np.asarray(agg.buffer_rgba())
        pixels = rgba[..., :3] if rgba[..., 3].min() == 255 else rgba
        Image.fromarray(pixels).save(path, format="png", compress_level=PNG_COMPRESSION, dpi=(figure.dpi, figure.dpi))
    finally:
        figure.set_canvas(canvas)


def plain_labels(figure: Figure) -> None:
    """Draw the figure's own labels as written: a `$` in a run name or a key is text, never mathtext
    (two of them would be parsed as a formula, and a bad one stops the drawing). Titles, axis
    labels, legends and annotations are set so; tick labels and axis offsets, which matplotlib's
    formatters write as mathtext, are not touched (nor created early)."""
    texts = list(figure.texts)
    legends = list(figure.legends)
    for ax in figure.axes:
        texts += [ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None),
                  ax.xaxis.label, ax.yaxis.label, *ax.texts]
        legends.append(ax.get_legend())
    for legend in legends:
        if legend is not None:
            texts += [*legend.get_texts(), legend.get_title()]
    for text in texts:
        if text is not None:
            text.set_parse_math(False)


def _style_axes(ax) -> None:
    for key, value in RC.items():
        if key.startswith("axes.spines."):
            ax.spines[key.rsplit(".", 1)[1]].set_visible(value)
    ax.grid(True, alpha=0.3)
    ax.set_prop_cycle(color=OKABE_ITO)
    ax.tick_params(labelsize=RC["xtick.labelsize"])
    ax.title.set_fontsize(RC["axes.titlesize"])
    ax.xaxis.label.set_fontsize(RC["axes.labelsize"])
    ax.yaxis.label.set_fontsize(RC["axes.labelsize"])


def spans_decades(values, decades: float = 1.5) -> bool:
    """True when the positive values span at least `decades` orders of magnitude (log10 max/min)."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array) & (array > 0)]
    if array.size < 2:
        return False
    return float(np.log10(array.max() / array.min())) >= decades


def legend(ax, **kwargs) -> None:
    """A legend only when the axes has labelled artists, placed where it covers least."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(fontsize=RC["legend.fontsize"], frameon=False, **({"loc": "best"} | kwargs))


def thin_step_ticks(ax, steps) -> None:
    """Integer step ticks on the x axis, never more than about a dozen."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, integer=True))


def plain_log_ticks(ax, *axes: str, narrow_below: float = 2.5) -> None:
    """Log-scaled `axes` ("x", "y") labelled as plain numbers at 1, 2, 5 × 10^k (at 10^k when the axis
    spans `narrow_below` decades or more, with unlabelled minor ticks at 2 and 5 × 10^k so that an axis
    with one label still reads as a scale). matplotlib's default minor ticks are left out: it labels them
    in mathtext when the span is under a decade, and they overlap; and eight a decade cost a report
    about a second of layout on two cores."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    for name in axes or ("x", "y"):
        axis = ax.xaxis if name == "x" else ax.yaxis
        low, high = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
        narrow = low > 0 and np.log10(high / low) < narrow_below  # 1, 2, 5 × 10^k fit; wider spans get decades only
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if narrow else (1.0,), numticks=12))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        axis.set_minor_locator(NullLocator() if narrow else LogLocator(base=10, subs=(2.0, 5.0), numticks=12))
        axis.set_minor_formatter(NullFormatter())


def point_marker(count: int, marker: str = "o", limit: int = 60) -> str | None:
    """`marker` for a line of `count` points, none beyond `limit` (markers on hundreds of steps are clutter)."""
    return marker if count <= limit else None


def step_spacing(steps) -> int:
    """The run's regular step interval: the most common difference between consecutive logged steps when at
    least two differences share it (a log written every k steps), else 1."""
    array = np.unique(np.asarray(steps, dtype=np.int64))
    differences = np.diff(array)
    if differences.size < 2:
        return 1
    values, counts = np.unique(differences, return_counts=True)
    best = int(np.argmax(counts))
    return int(values[best]) if counts[best] >= 2 else 1


def step_segments(steps) -> list[slice]:
    """Slices of the sorted `steps` with no missing step inside: a new segment starts wherever consecutive
    steps are further apart than the run's regular interval (`step_spacing`)."""
    array = np.asarray(steps, dtype=np.int64)
    if array.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(array) > step_spacing(array)) + 1
    edges = [0, *breaks.tolist(), array.size]
    return [slice(start, end) for start, end in zip(edges[:-1], edges[1:])]


def missing_steps(steps) -> int:
    """How many steps are missing between the first and last logged step, at the run's regular interval."""
    array = np.unique(np.asarray(steps, dtype=np.int64))
    if array.size < 2:
        return 0
    spacing = step_spacing(array)
    return int((array[-1] - array[0]) // spacing + 1 - array.size)


def plot_steps(ax, steps, values, *, label: str | None = None, marker: str | None = None, **kwargs) -> None:
    """A line over steps that breaks where steps are missing (no line drawn across a gap); a segment of one
    step is drawn as a point so it stays visible."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    kwargs.setdefault("markersize", 3)
    for index, part in enumerate(step_segments(steps)):
        single = part.stop - part.start == 1
        ax.plot(steps[part], values[part], label=label if index == 0 else None,
                marker=marker or ("o" if single else None), **kwargs)


def fill_steps(ax, steps, low, high, *, label: str | None = None, **kwargs) -> None:
    """A band over steps that breaks where steps are missing, like `plot_steps`."""
    steps = np.asarray(steps)
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    for index, part in enumerate(step_segments(steps)):
        ax.fill_between(steps[part], low[part], high[part], label=label if index == 0 else None, **kwargs)


# Two step numberings: a workload step is one rollout call (generation batch) of a PolyTrace trace; a trainer
# step is one optimizer step of a training log. They differ for DAPO, where several rollout calls feed a step.
WORKLOAD_STEP = "workload step (rollout call)"
TRAINER_STEP = "trainer step"


def step_axis_label(bases) -> str:
    """The x label for a step axis whose rows come from the given analysis bases: 'samples' rows are numbered
    by workload step, step-aggregate rows ('step_aggregates', 'global_seqlen') by trainer step."""
    kinds = {WORKLOAD_STEP if basis == "samples" else TRAINER_STEP for basis in bases if basis is not None}
    if kinds == {WORKLOAD_STEP}:
        return WORKLOAD_STEP
    if kinds == {TRAINER_STEP}:
        return TRAINER_STEP
    return "step (workload step for traces, trainer step for training logs)"


def new_grid(count: int, *, columns: int = 3, width: float = 10.0, panel_height: float = 3.6) -> tuple[Figure, list]:
    """A figure of `count` panels, `columns` to a row (fewer when there are fewer panels), one screen wide;
    the unused cells of the last row are removed, so no empty panel is drawn."""
    columns = max(1, min(columns, count))
    rows = -(-count // columns)
    figure, axes = new_figure(columns, rows, width=width, height=panel_height * rows)
    for extra in axes[count:]:
        figure.delaxes(extra)
    return figure, list(axes[:count])


# Labels are placed before the figure is laid out: an outside legend or colour bar may then narrow the axes by
# up to this share, so each label is given room as if the axes were that much narrower.
LABEL_ROOM = 0.8


def label_points(ax, xs, ys, labels, *, colour: str = "#333333", levels: int = 3) -> int:
    """Annotate points with labels that never overlap: each label sits in one of `levels` rows near the top
    of the axes, in the first row where it clears the previous label of that row (its width measured from the
    7 pt font, on axes LABEL_ROOM as wide as they are before layout), kept inside the axes' width, with a thin
    line to its point; labels that fit no row are dropped. Returns how many were drawn."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    low, high = ax.get_xlim()
    span = (high - low) or 1.0
    axes_points = ax.get_position().width * ax.figure.get_figwidth() * 72 * LABEL_ROOM
    font, measure = FontProperties(size=7), TextToPath()
    last: list[tuple[float, float] | None] = [None] * levels  # (centre, half width) of each row's last label
    drawn = 0
    for x, y, text in sorted(zip(xs, ys, labels), key=lambda item: item[0]):
        width = measure.get_text_width_height_descent(text, font, ismath=False)[0]
        half = min(0.5, width / axes_points / 2 + 0.005)
        position = min(max((x - low) / span, half), 1 - half)
        level = next((i for i in range(levels)
                      if last[i] is None or position - half > last[i][0] + last[i][1] + 0.01), None)
        if level is None:
            continue
        last[level] = (position, half)
        ax.annotate(text, (x, y), xytext=(position, 0.97 - 0.09 * level), textcoords="axes fraction",
                    ha="center", va="top", fontsize=7, color=colour,
                    arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.6, "alpha": 0.7})
        drawn += 1
    return drawn


def plain_colorbar(colorbar) -> None:
    """Colour-bar tick labels as plain numbers with thousands separators, no minor ticks (a log-scaled bar
    otherwise mixes 10^1 with 4 × 10^0)."""
    from matplotlib.ticker import FuncFormatter

    colorbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    colorbar.minorticks_off()
