"""What every figure of the report shares: matplotlib (imported lazily, headless), saving, a legend
beside the axes (never over the data), integer ticks for counts and indices, a sentence in place of
a panel with nothing to draw, and a category axis that stays readable with one category or many."""

import textwrap
from pathlib import Path

# Legend text size; the legend stands right of its axes, top-aligned with them.
LEGEND_FONT = 8


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """Lay the figure out and write it; the saved image grows to hold legends beside the axes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:  # a figure made with a layout engine (constrained) keeps it
        fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    pyplot().close(fig)


def legend_beside(ax, handles=None, labels=None, title: str | None = None):
    """The legend right of the axes, top-aligned with them: beside the data, never over it."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    return ax.legend(
        handles,
        labels,
        title=title,
        fontsize=LEGEND_FONT,
        title_fontsize=LEGEND_FONT,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
    )


def integer_ticks(axis) -> None:
    """Ticks on whole numbers only (`axis`: ax.xaxis or ax.yaxis), however short the axis."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1, steps=[1, 2, 5, 10]))


def percent_ticks(axis) -> None:
    """Shares (0 to 1) labelled as percentages, without trailing zeros: 5%, 2.5%."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(steps=[1, 2, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda share, _: f"{round(100 * share, 6):g}%"))


def empty_panel(ax, title: str, sentence: str, width: int = 48) -> None:
    """A panel with nothing to draw: its title, and in place of the plot a sentence saying why."""
    ax.set_title(title)
    ax.text(
        0.5,
        0.5,
        textwrap.fill(sentence, width, break_on_hyphens=False),  # a flag such as --enable-metrics stays whole
        ha="center",
        va="center",
        transform=ax.transAxes,
        color="0.25",
        bbox={"boxstyle": "round,pad=0.6", "facecolor": "0.96", "edgecolor": "0.8"},
    )
    ax.set_axis_off()


def category_axis(ax, names: list[str], *, horizontal: bool = False) -> None:
    """One tick per category; a few categories keep bar-wide gaps, so one bar does not fill the panel."""
    positions = list(range(len(names)))
    span = (-0.5 - max(0.0, (3 - len(names)) / 2), len(names) - 0.5 + max(0.0, (3 - len(names)) / 2))
    if horizontal:
        ax.set_yticks(positions, names)
        ax.set_ylim(span[1], span[0])  # the first category on top, as the legend and the tables read
    else:
        tilted = len(names) > 4 or max((len(n) for n in names), default=0) > 10
        ax.set_xticks(positions, names, rotation=30 if tilted else 0, ha="right" if tilted else "center")
        ax.set_xlim(*span)


def series_name(category: str, mode: str, several_modes: bool) -> str:
    """A figure's name for a category's rows of one mode: "math (instant)" where the run has several modes."""
    return f"{category} ({mode})" if several_modes else category


def by_series(per_category: dict[str, dict], several: bool | None = None) -> dict:
    """{category: {mode: value}} as the figures' series (`series_name`); `several`: whether the run has
    several modes (default: whether `per_category` holds several)."""
    if several is None:
        several = len({mode for by_mode in per_category.values() for mode in by_mode}) > 1
    return {
        series_name(category, mode, several): value
        for category, by_mode in per_category.items()
        for mode, value in by_mode.items()
    }
