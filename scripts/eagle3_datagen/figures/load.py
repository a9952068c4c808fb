"""The load figure: how the server carried each category. Top: KV-cache retractions, prefix-cache
hits and time queued per category, each a sentence when there is nothing to show; below: the
requests in flight over each generate job's run, against the concurrency limit and what the server
reported running and waiting."""

from eagle3_datagen.figures.base import (
    category_axis,
    empty_panel,
    integer_ticks,
    legend_beside,
    percent_ticks,
    pyplot,
)

NO_ANSWERS = "No answered rows: nothing to measure."
NO_RETRACTIONS = "No retractions: the server never ran out of KV cache for the requests it was running."
NO_CACHE_HITS = (
    "No prefix-cache hits: no prompt token was served from the server's prefix cache (no prompt shared a "
    "prefix the server still held, or its radix cache is off)."
)
NO_QUEUE_TIMES = "Queue times not reported: SGLang reports them only when started with --enable-metrics."
NO_TIMELINE = "No timeline: no generate job sent a request (every answer came from the journal)."
# The line style of each timeline column, and what it says.
STYLES = (
    ("in_flight", "-", "in flight (sent by the client, not yet answered)"),
    ("limit", "--", "concurrency limit"),
    ("running", ":", "running on the server"),
    ("waiting", "-.", "waiting in the server's queue"),
)


def _number(value) -> float | None:
    return None if value is None or value != value else float(value)


def _bars(ax, names: list[str], values: list, title: str, ylabel: str, empty: str) -> None:
    """One bar per category, or `empty` in its place when every value is zero or missing."""
    if not names or not any(values):
        empty_panel(ax, title, empty if names else NO_ANSWERS, width=34)
        return
    ax.bar(range(len(names)), values, 0.6)
    category_axis(ax, names)
    ax.set(title=title, ylabel=ylabel)
    ax.set_ylim(0, max(values) * 1.1)


def _queue(ax, frame, names: list[str]) -> None:
    title = "Seconds queued in the server"
    means = [_number(v) for v in frame["queue_time_mean_s"]] if names else []
    p90 = [_number(v) for v in frame["queue_time_p90_s"]] if names else []
    if not names or all(v is None for v in means):
        empty_panel(ax, title, NO_QUEUE_TIMES if names else NO_ANSWERS, width=34)
        return
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [v or 0.0 for v in means], 0.4, label="mean")
    ax.bar([i + 0.2 for i in x], [v or 0.0 for v in p90], 0.4, label="90th percentile")
    for i, v in zip(x, means):
        if v is None:
            ax.text(i, 0, "not\nreported", ha="center", va="bottom", fontsize=7, color="0.3")
    category_axis(ax, names)
    ax.set(title=title, ylabel="seconds")
    legend_beside(ax)


def _timeline(ax, label: str, cols: dict) -> list:
    """One job's requests over its run, a line per timeline column it has; the lines drawn."""
    lines = []
    for k, (column, style, meaning) in enumerate(STYLES):
        values = [float("nan") if v is None else v for v in cols.get(column, [])]
        if values and any(v == v for v in values):
            lines += ax.plot(cols["t"], values, linestyle=style, color=f"C{k}", label=meaning)
    ax.set_title(f"Requests over the run of job {label}")
    integer_ticks(ax.yaxis)
    ax.set_ylim(bottom=0)
    return lines


def draw_load(frame, timelines: dict[str, list]):
    """How the server carried each category (`frame`: the load table; `timelines`: per category, its
    generate jobs' (label, timeline columns)): a row of per-category panels, then one panel per
    generate job (three a row, one y scale); the figure, unsaved."""
    names = [str(c) for c in frame["category"]] if len(frame) and frame["answered"].sum() else []
    jobs = [(label, cols) for name in names for label, cols in timelines.get(name, [])]  # in category order
    columns = min(3, max(len(jobs), 1))
    rows = -(-max(len(jobs), 1) // columns)
    retractions = [float(v) for v in frame["retractions_per_1000"]] if names else []
    hits = [float(v) for v in frame["cache_hit_share"]] if names else []
    reported = names and any(_number(v) is not None for v in frame["queue_time_mean_s"])
    height = 3.6 if any(retractions) or any(hits) or reported else 2.0  # sentences only: a short row
    fig = pyplot().figure(figsize=(14, height + 3.0 * rows), layout="constrained")
    outer = fig.add_gridspec(2, 1, height_ratios=(height, 3.0 * rows))
    top = [fig.add_subplot(cell) for cell in outer[0].subgridspec(1, 3)]
    _bars(top[0], names, retractions, "KV-cache retractions per 1,000 answers", "retractions", NO_RETRACTIONS)
    _bars(top[1], names, hits, "Prefix-cache hits", "share of prompt tokens", NO_CACHE_HITS)
    if top[1].axison:
        percent_ticks(top[1].yaxis)
    _queue(top[2], frame, names)
    grid = outer[1].subgridspec(rows, columns)
    if not jobs:
        empty_panel(fig.add_subplot(grid[0, 0]), "Requests over each generate job's run", NO_TIMELINE, width=90)
        return fig
    axes = [fig.add_subplot(grid[k // columns, k % columns]) for k in range(len(jobs))]
    lines = {}
    for ax, (label, cols) in zip(axes, jobs):
        lines.update((line.get_label(), line) for line in _timeline(ax, label, cols))
    top_line = max(ax.get_ylim()[1] for ax in axes)
    for k, ax in enumerate(axes):
        ax.set_ylim(0, top_line)  # one scale: the jobs compare at a glance
        if k + columns >= len(axes):  # the lowest panel of its column
            ax.set_xlabel("seconds since the job's client started")
        if k % columns == 0:
            ax.set_ylabel("requests")
    legend_beside(axes[columns - 1], list(lines.values()), list(lines))
    return fig
