"""The figures of what the run produced, per series (a category, or a category and serving mode):
prompt and output lengths, and rows and output tokens by turn index."""

from eagle3_datagen.figures.base import empty_panel, integer_ticks, legend_beside, pyplot

NO_LENGTHS = "No answered rows: every row was skipped or failed, so there are no lengths to draw."
NO_TURNS = "No rows: the turns table is empty."
NO_TOKENS = "No output tokens: no turn produced an answer."
NOT_PRODUCED = "not produced: the conversation ended"


def _bins(values: list[int], most: int = 40) -> list[float]:
    """Edges shared by every series, on whole tokens: at most `most` bins over the range of `values`."""
    low, high = min(values), max(values) + 1
    step = max(1, -(-(high - low) // most))
    return [low + k * step - 0.5 for k in range(-(-(high - low) // step) + 1)]


def draw_lengths(lengths: dict[str, tuple[list[int], list[int]]]):
    """Histograms of prompt and output lengths (tokens) of the answered rows, one outline per series,
    on bins shared by all of them so their shapes compare; the figure, unsaved."""
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4))
    names = sorted(lengths)
    colours = {name: f"C{k % 10}" for k, name in enumerate(names)}
    for ax, which, what in ((axes[0], 0, "prompt tokens"), (axes[1], 1, "output tokens")):
        title = f"Distribution of {what}"
        values = [v for name in names for v in lengths[name][which]]
        if not values:
            empty_panel(ax, title, NO_LENGTHS)
            continue
        edges = _bins(values)
        for name in names:
            if lengths[name][which]:
                ax.hist(lengths[name][which], bins=edges, histtype="stepfilled", color=colours[name], alpha=0.12)
                ax.hist(lengths[name][which], bins=edges, histtype="step", color=colours[name], linewidth=1.6,
                        label=f"{name}, n={len(lengths[name][which])}")  # fmt: skip
        ax.set(title=title, xlabel=what, ylabel="rows")
        integer_ticks(ax.xaxis)
        integer_ticks(ax.yaxis)
    drawn = [ax for ax in axes if ax.axison]
    if drawn:
        legend_beside(drawn[-1], title="answered rows")
    return fig


def _turn_counts(frame) -> tuple[list[int], list[int], list[int], list[int]]:
    """(turn indices, rows produced, rows not produced, output tokens) of one series of the turns table."""
    index = sorted({int(t) for t in frame["turn"]})
    made, missing, tokens = [], [], []
    for t in index:
        at = frame[frame["turn"] == t]
        made.append(int(at[at["status"] != "skipped"]["rows"].sum()))
        missing.append(int(at[at["status"] == "skipped"]["rows"].sum()))
        tokens.append(int(at["output_tokens"].sum()))
    return index, made, missing, tokens


def draw_turns(turns):
    """Rows and output tokens by turn index, per series (`turns`: the turns table, its `category`
    column naming the series): the rows produced as bars, those not produced (skipped: the
    conversation ended) hatched on top; the figure, unsaved."""
    from matplotlib.patches import Patch

    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4))
    rows_title, tokens_title = "Rows per turn index", "Output tokens per turn index"
    names = sorted(set(turns["category"])) if len(turns) else []
    if not names:
        empty_panel(axes[0], rows_title, NO_TURNS)
        empty_panel(axes[1], tokens_title, NO_TURNS)
        return fig
    width = 0.8 / len(names)
    ended = False
    for n, name in enumerate(names):
        index, made, missing, tokens = _turn_counts(turns[turns["category"] == name])
        x = [t + (n - (len(names) - 1) / 2) * width for t in index]
        colour = f"C{n % 10}"
        axes[0].bar(x, made, width, color=colour, label=name)
        hatched = [(at, m, b) for at, m, b in zip(x, missing, made) if m]  # zero-high bars would pin the axis
        if hatched:
            ended = True
            xs, ms, bs = zip(*hatched)
            axes[0].bar(xs, ms, width, bottom=bs, color=colour, alpha=0.35, hatch="//", edgecolor="0.25")
        axes[1].bar(x, tokens, width, color=colour, label=name)
    for ax, title, ylabel in ((axes[0], rows_title, "rows"), (axes[1], tokens_title, "output tokens")):
        ax.set(title=title, xlabel="turn index (0: a conversation's first regenerated turn)", ylabel=ylabel)
        integer_ticks(ax.xaxis)
        integer_ticks(ax.yaxis)
    if not any(bar.get_height() for bar in axes[1].patches):
        axes[1].clear()
        empty_panel(axes[1], tokens_title, NO_TOKENS)
    handles, labels = axes[0].get_legend_handles_labels()
    if ended:
        handles, labels = [*handles, Patch(facecolor="white", edgecolor="0.25", hatch="//")], [*labels, NOT_PRODUCED]
    legend_beside(axes[1], handles, labels)
    return fig
