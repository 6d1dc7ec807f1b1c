"""One look for every figure: Agg backend, readable labels, the Okabe–Ito colour-blind-safe palette."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

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
    """A figure in the report style and its axes as a flat array (not attached to pyplot's state)."""
    with plt.rc_context(RC):
        figure = Figure(figsize=(width, height), layout="constrained")
        axes = figure.subplots(nrows, ncols, squeeze=False)
    for ax in axes.flat:
        _style_axes(ax)
    return figure, axes.ravel()


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


def plain_log_ticks(ax, *axes: str) -> None:
    """Log-scaled `axes` ("x", "y") labelled as plain numbers at 1, 2, 5 × 10^k (at 10^k when the axis
    spans 2.5 decades or more), without minor labels
    (matplotlib's default labels every minor tick in mathtext when the span is under a decade, and they overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for name in axes or ("x", "y"):
        axis = ax.xaxis if name == "x" else ax.yaxis
        low, high = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
        narrow = low > 0 and np.log10(high / low) < 2.5  # 1, 2, 5 × 10^k fit; wider spans get decades only
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if narrow else (1.0,), numticks=12))
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())


def point_marker(count: int, marker: str = "o", limit: int = 60) -> str | None:
    """`marker` for a line of `count` points, none beyond `limit` (markers on hundreds of steps are clutter)."""
    return marker if count <= limit else None
