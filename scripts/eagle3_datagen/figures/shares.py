"""The figures of how the answers came out, one horizontal bar per series (a category, or a category
and serving mode): parser-check verdicts and the reasoning share of output tokens (shares of a
whole), and how each row ended (rows)."""

from eagle3_datagen.figures.base import (
    category_axis,
    empty_panel,
    integer_ticks,
    legend_beside,
    percent_ticks,
    pyplot,
)

# Fixed colours, so a class keeps its colour whichever classes a run has: green is the good outcome.
VERDICT_COLOURS = ("tab:green", "tab:red", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                   "tab:cyan", "tab:gray")  # fmt: skip
SHARE_COLOURS = {"reasoning": "tab:blue", "answer": "tab:orange"}
FINISHES = ("stop", "length after </think>", "length, no </think>", "loop stopped live", "failed", "skipped")
FINISH_COLOURS = ("tab:green", "tab:orange", "tab:red", "tab:purple", "black", "0.75")
NO_ROWS = "No rows: nothing was generated, so there is nothing to draw."


def _stacked(title: str, empty: str | None, names: list[str], series: dict[str, list[float]], colours, *,
             xlabel: str, share: bool):  # fmt: skip
    """Horizontal bars, one per name, stacked from `series` (label -> value per name) in order, labels
    whose values are all zero left out of the bars and the legend; `empty`: the sentence in their
    place, if any. The figure, unsaved."""
    fig, ax = pyplot().subplots(figsize=(11, max(2.6, 1.3 + 0.45 * len(names))))
    if empty is not None:
        empty_panel(ax, title, empty, width=80)
        return fig
    left = [0.0] * len(names)
    for (label, values), colour in zip(series.items(), colours):
        if any(values):
            ax.barh(range(len(names)), values, left=left, label=label, color=colour)
            left = [a + b for a, b in zip(left, values)]
    category_axis(ax, names, horizontal=True)
    ax.set(title=title, xlabel=xlabel)
    if share:
        ax.set_xlim(0, 1)
        percent_ticks(ax.xaxis)
    else:
        integer_ticks(ax.xaxis)
    legend_beside(ax)
    return fig


def draw_verdicts(verdicts: dict, order: tuple[str, ...]):
    """Share of rows per parser-check verdict (in `order`), per series (`verdicts`: VerdictTally per
    series); the figure, unsaved."""
    names = sorted(verdicts)
    empty = None if any(verdicts[n].rows for n in names) else NO_ROWS
    series = {v: [verdicts[n].verdicts.get(v, 0) / max(verdicts[n].rows, 1) for n in names] for v in order}
    labels = [f"{n}: {verdicts[n].rows:,} rows" for n in names]
    title = "Would the OpenAI chat route give back the same tokens? (parser-check verdicts)"
    return _stacked(title, empty, labels, series, VERDICT_COLOURS, xlabel="share of the generated rows", share=True)


def draw_token_share(verdicts: dict):
    """Reasoning tokens (before `</think>`) against answer tokens, as shares of each series' output
    tokens; the figure, unsaved."""
    names = sorted(verdicts)
    reasoning = [verdicts[n].reasoning_tokens for n in names]
    answer = [verdicts[n].answer_tokens for n in names]
    empty = None if any(reasoning) or any(answer) else "No output tokens: " + NO_ROWS.split(": ", 1)[1]
    totals = [a + b for a, b in zip(reasoning, answer)]
    series = {
        "reasoning": [a / t if t else 0.0 for a, t in zip(reasoning, totals)],
        "answer": [b / t if t else 0.0 for b, t in zip(answer, totals)],
    }
    labels = [f"{n}: {t:,} tokens" for n, t in zip(names, totals)]
    title = "Reasoning against answer: share of the output tokens"
    colours = [SHARE_COLOURS[k] for k in series]
    return _stacked(title, empty, labels, series, colours, xlabel="share of output tokens", share=True)


def draw_finish_reasons(finishes: dict[str, tuple]):
    """How answers ended, rows per series (`finishes`: per series, rows per FINISHES kind): stop token,
    length cut after `</think>`, length cut inside the reasoning, stopped by the client as a loop,
    failed, skipped; the figure, unsaved."""
    names = sorted(finishes)
    empty = None if any(sum(finishes[n]) for n in names) else NO_ROWS
    series = {kind: [finishes[n][k] for n in names] for k, kind in enumerate(FINISHES)}
    return _stacked("How each row ended", empty, names, series, FINISH_COLOURS, xlabel="rows", share=False)
