"""The report's figures, drawn from plain data (no file reading): lengths, turns, pilot projection,
parser-check verdicts, reasoning share, finish reasons, server load. Imports matplotlib only, lazily;
the steps that gather the data (summarize, plot_checks, plot_load, project_pilot) call it."""

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def plot_lengths(lengths: dict[str, tuple[list[int], list[int]]], path: Path) -> None:
    """Histograms of prompt and output lengths (tokens), one colour per category."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, which, title in ((axes[0], 0, "prompt tokens"), (axes[1], 1, "output tokens")):
        for category, pair in sorted(lengths.items()):
            if pair[which]:
                ax.hist(pair[which], bins=30, alpha=0.55, label=f"{category} (n={len(pair[which])})")
        ax.set_xlabel(title)
        ax.set_ylabel("rows")
        ax.set_title(f"Distribution of {title}")
        ax.legend(fontsize=8)
    _save(fig, path)


def plot_turns(turns, path: Path) -> None:
    """Rows and output tokens by turn index, per category (`turns`: the turns table): the generated
    rows as bars, the rows not produced (skipped: the conversation ended) hatched on top."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    categories = sorted(set(turns["category"])) if len(turns) else []
    width = 0.8 / max(len(categories), 1)
    for n, category in enumerate(categories):
        frame = turns[turns["category"] == category]
        index = sorted(set(frame["turn"]))
        made = [int(frame[(frame["turn"] == t) & (frame["status"] != "skipped")]["rows"].sum()) for t in index]
        missing = [int(frame[(frame["turn"] == t) & (frame["status"] == "skipped")]["rows"].sum()) for t in index]
        tokens = [int(frame[frame["turn"] == t]["output_tokens"].sum()) for t in index]
        x = [t + n * width for t in index]
        bars = axes[0].bar(x, made, width, label=f"{category}")
        axes[0].bar(x, missing, width, bottom=made, color=bars.patches[0].get_facecolor(), alpha=0.35, hatch="//")
        axes[1].bar(x, tokens, width, label=category)
    axes[0].set_title("Rows by turn (hatched: not produced, the conversation ended)")
    axes[1].set_title("Output tokens by turn")
    for ax, ylabel in ((axes[0], "rows"), (axes[1], "output tokens")):
        ax.set_xlabel("turn index")
        ax.set_ylabel(ylabel)
        if categories:
            ax.legend(fontsize=8)
    _save(fig, path)


def plot_projection(rows: list[dict], path: Path, labels: list[str] | None = None) -> None:
    """Projected output tokens and GPU-hours (server-hours where the server's GPUs are unknown) per
    projection row (a category, or one of its serving modes), with the 95 % interval from the pilot
    sample's spread; `labels` name the bars (default: the rows' categories)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(max(11, 0.6 * len(rows) + 4), 4))
    names = labels if labels is not None else [r["category"] for r in rows]
    if len(names) != len(rows):
        raise ValueError(f"{len(names)} labels for {len(rows)} projection rows")
    x = range(len(rows))
    axes[0].bar(x, [r["output_tokens"] for r in rows], yerr=[r["output_tokens_ci95"] for r in rows], capsize=4)
    axes[0].set_title("Projected output tokens (95 % interval)")
    gpu = all(r["gpu_hours"] is not None for r in rows)
    key, label = ("gpu_hours", "GPU-hours") if gpu else ("server_hours", "server-hours")
    hours = [r[key] or 0.0 for r in rows]
    ci = [(r["server_hours_ci95"] or 0.0) * (r["gpus_per_server"] if gpu else 1) for r in rows]
    axes[1].bar(x, hours, yerr=ci, capsize=4, color="tab:orange")
    axes[1].set_title(f"Projected {label} at the pilot's throughput (95 % interval)")
    for ax in axes:
        ax.set_xticks(list(x), names, rotation=30, ha="right")
    _save(fig, path)


def _stacked(ax, categories: list[str], series: dict[str, list[float]], *, xlabel: str) -> None:
    left = [0.0] * len(categories)
    for name, values in series.items():
        if any(values):
            ax.barh(categories, values, left=left, label=name)
            left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8, loc="lower right")


def plot_verdicts(verdicts: dict, path: Path, order: tuple[str, ...]) -> None:
    """Share of rows per parser-check verdict (in `order`), per category (`verdicts`: VerdictTally per category)."""
    plt = _pyplot()
    categories = sorted(verdicts)
    series = {}
    for v in order:
        series[v] = [verdicts[c].verdicts.get(v, 0) / max(verdicts[c].rows, 1) for c in categories]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(categories)))
    _stacked(ax, categories, series, xlabel="share of generated rows")
    ax.set_title("Would the OpenAI chat route give back the same tokens? (parser check verdicts)")
    _save(fig, path)


def plot_token_share(verdicts: dict, path: Path) -> None:
    """Reasoning tokens (before `</think>`) against answer tokens, per category."""
    plt = _pyplot()
    categories = sorted(verdicts)
    reasoning = [verdicts[c].reasoning_tokens for c in categories]
    answer = [verdicts[c].answer_tokens for c in categories]
    totals = [max(a + b, 1) for a, b in zip(reasoning, answer)]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(categories)))
    _stacked(
        ax,
        categories,
        {"reasoning": [a / t for a, t in zip(reasoning, totals)], "answer": [b / t for b, t in zip(answer, totals)]},
        xlabel="share of output tokens",
    )
    ax.set_title("Reasoning vs answer tokens")
    _save(fig, path)


FINISHES = ("stop", "length after </think>", "length, no </think>", "loop stopped live", "failed", "skipped")


def plot_finish_reasons(finishes: dict[str, tuple], path: Path) -> None:
    """How answers ended: stop token, length cut after `</think>`, length cut inside the reasoning,
    stopped by the client as a loop, failed, skipped."""
    plt = _pyplot()
    categories = sorted(finishes)
    series = {n: [finishes[c][k] for c in categories] for k, n in enumerate(FINISHES)}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(categories)))
    _stacked(ax, categories, series, xlabel="rows")
    ax.set_title("Finish reasons")
    _save(fig, path)


def draw_load(frame, timelines: dict[str, list], path: Path) -> None:
    """How the server carried each category (`frame`: the load table; `timelines`: per category, its
    generate jobs' (label, timeline columns)): retractions per 1,000 answers, prefix-cache hit
    share, seconds queued (mean and 90th percentile, where the server reports it), and the
    requests in flight over each job's run, with the concurrency limit and the server's running
    and waiting requests."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    categories = list(frame["category"]) if len(frame) else []
    x = list(range(len(categories)))
    ax = axes[0][0]
    ax.bar(x, list(frame["retractions_per_1000"]) if categories else [])
    ax.set_title("KV-cache retractions per 1,000 answers")
    ax = axes[0][1]
    ax.bar(x, [100 * v for v in frame["cache_hit_share"]] if categories else [])
    ax.set_title("Prefix-cache hits (% of prompt tokens)")
    ax = axes[1][0]
    means = [v if v == v and v is not None else 0.0 for v in frame["queue_time_mean_s"]] if categories else []
    p90 = [v if v == v and v is not None else 0.0 for v in frame["queue_time_p90_s"]] if categories else []
    ax.bar([i - 0.2 for i in x], means, 0.4, label="mean")
    ax.bar([i + 0.2 for i in x], p90, 0.4, label="90th percentile")
    ax.set_title("Seconds queued in the server" + ("" if any(means) else " (not reported: --enable-metrics)"))
    ax.legend(fontsize=8)
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        ax.set_xticks(x, categories, rotation=30, ha="right")
        top = max((bar.get_height() for bar in ax.patches), default=0.0)
        ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)  # all zero (no retraction, no hit): a zero axis
    ax = axes[1][1]
    for category in categories:
        for label, cols in timelines.get(category, []):
            (line,) = ax.plot(cols["t"], cols["in_flight"], label=f"{label} in flight")
            ax.plot(cols["t"], cols["limit"], linestyle="--", color=line.get_color(), alpha=0.6)
            running = [v if v is not None else float("nan") for v in cols.get("running", [])]
            if running and any(v == v for v in running):
                ax.plot(cols["t"], running, linestyle=":", color=line.get_color(), alpha=0.8)
    ax.set_xlabel("seconds since the job's client started")
    ax.set_ylabel("requests")
    ax.set_title("In flight (solid), limit (dashed), running on the server (dotted)")
    if ax.lines:
        ax.legend(fontsize=7)
    _save(fig, path)
