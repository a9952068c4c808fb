"""The report's figures: lengths, parser-check verdicts, reasoning share, finish reasons; plot_checks."""

import logging
from pathlib import Path

from .check_parsers import VERDICTS
from .tables import read_provenance, read_rows

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


def _stacked(ax, categories: list[str], series: dict[str, list[float]], *, xlabel: str) -> None:
    left = [0.0] * len(categories)
    for name, values in series.items():
        if any(values):
            ax.barh(categories, values, left=left, label=name)
            left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8, loc="lower right")


def plot_verdicts(verdicts: dict[str, list[dict]], path: Path) -> None:
    """Share of rows per parser-check verdict, per category."""
    plt = _pyplot()
    categories = sorted(verdicts)
    series = {}
    for v in VERDICTS:
        series[v] = [sum(r["verdict"] == v for r in verdicts[c]) / max(len(verdicts[c]), 1) for c in categories]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(categories)))
    _stacked(ax, categories, series, xlabel="share of generated rows")
    ax.set_title("Would the OpenAI chat route give back the same tokens? (parser check verdicts)")
    _save(fig, path)


def plot_token_share(verdicts: dict[str, list[dict]], path: Path) -> None:
    """Reasoning tokens (before `</think>`) against answer tokens, per category."""
    plt = _pyplot()
    categories = sorted(verdicts)
    reasoning = [sum(r["n_reasoning_tokens"] for r in verdicts[c]) for c in categories]
    answer = [sum(r["n_answer_tokens"] for r in verdicts[c]) for c in categories]
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


def plot_finish_reasons(generations: dict[str, list[dict]], reasoning_end_id: int | None, path: Path) -> None:
    """How answers ended: stop token, length cut after `</think>`, length cut inside the reasoning, failed."""
    plt = _pyplot()
    categories = sorted(generations)
    names = ("stop", "length after </think>", "length, no </think>", "failed", "skipped")
    series = {n: [] for n in names}
    for c in categories:
        rows = generations[c]
        ok = [r for r in rows if r["status"] == "ok"]
        truncated = [r for r in ok if r["finish_type"] == "length"]
        inside = sum(reasoning_end_id is not None and reasoning_end_id not in r["output_ids"] for r in truncated)
        values = (
            len(ok) - len(truncated),
            len(truncated) - inside,
            inside,
            sum(r["status"] == "failed" for r in rows),
            sum(r["status"] == "skipped" for r in rows),
        )
        for n, v in zip(names, values):
            series[n].append(v)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(categories)))
    _stacked(ax, categories, series, xlabel="rows")
    ax.set_title("Finish reasons")
    _save(fig, path)


def plot_checks(
    *,
    categories: list[str],
    verdicts: list[Path],
    generations: list[Path],
    verdicts_png: Path,
    token_share_png: Path,
    finish_reasons_png: Path,
) -> None:
    """Draw the parser-check verdicts, reasoning share and finish reasons of every category."""
    by_category = {c: read_rows(p) for c, p in zip(categories, verdicts)}
    gens = {c: read_rows(p) for c, p in zip(categories, generations)}
    # The id of the reasoning end token, as tokenize_prompts read it from the tokenizer.
    reasoning_end = read_provenance(generations[0])["prompts"]["reasoning_end_id"] if generations else None
    plot_verdicts(by_category, verdicts_png)
    plot_token_share(by_category, token_share_png)
    plot_finish_reasons(gens, reasoning_end, finish_reasons_png)
