"""Step plot_quality: the quality gate in the report, from summarize's tables: per category, the rows
each flag code marked, kept in the dataset or quarantined (`flag_<code>`, `quarantined_<code>` of the
summary); per turn index, the share of the generated rows each code marked (the turns table).
"""

import logging
from pathlib import Path

import pandas as pd

from eagle3_datagen.figures.base import (
    category_axis,
    empty_panel,
    integer_ticks,
    legend_beside,
    percent_ticks,
    pyplot,
    save,
    series_name,
)
from eagle3_datagen.quality.flags import CODES, QualitySettings
from eagle3_datagen.settings import ALL_MODES

log = logging.getLogger(__name__)

# Rows of the turns table that were generated (flags are read from output ids: only these have one).
GENERATED = ("ok", "filtered")
NOTHING_FLAGGED = "No row was flagged by the quality gate ({}): nothing to draw."
# Turn indices up to this many get a tick each; more, whole numbers picked by the locator.
TICK_EVERY_TURN = 12


def _require(frame: pd.DataFrame, columns: list[str], table: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{table} lacks the quality columns {missing} (summarize writes them): rerun summarize")


def _mode_rows(summary: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The summary's rows of one category and mode each (no totals, no whole-category `all` rows),
    and whether the run has several modes."""
    rows = summary[summary["category"] != "total"]
    if "mode" not in rows.columns:
        return rows, False
    rows = rows[rows["mode"] != ALL_MODES]
    return rows, rows["mode"].nunique() > 1


def flags_by_category(summary: pd.DataFrame) -> dict[str, dict[str, tuple[int, int]]]:
    """Per category, and per category and mode where the run has several (the totals aside): per code,
    (rows flagged and kept, rows flagged and quarantined)."""
    _require(summary, [f"{p}_{code}" for code in CODES for p in ("flag", "quarantined")], "the summary table")
    out = {}
    rows, several = _mode_rows(summary)
    for _, row in rows.iterrows():
        out[series_name(str(row["category"]), str(row.get("mode", "")), several)] = {
            code: (int(row[f"flag_{code}"]) - int(row[f"quarantined_{code}"]), int(row[f"quarantined_{code}"]))
            for code in CODES
        }
    return out


def flag_shares_by_turn(turns: pd.DataFrame) -> tuple[list[int], dict[str, list[float]]]:
    """(turn indices with generated rows, per code the share of each turn's generated rows it flagged)."""
    _require(turns, ["turn", "rows", *(f"flag_{code}" for code in CODES)], "the turns table")
    generated = turns[turns["status"].isin(GENERATED)] if "status" in turns.columns else turns
    by_turn = generated.groupby("turn")[["rows", *(f"flag_{code}" for code in CODES)]].sum()
    by_turn = by_turn[by_turn["rows"] > 0].sort_index()
    index = [int(t) for t in by_turn.index]
    return index, {code: [float(v) for v in by_turn[f"flag_{code}"] / by_turn["rows"]] for code in CODES}


def _nothing(ax, title: str) -> None:
    empty_panel(ax, title, NOTHING_FLAGGED.format(", ".join(CODES)), width=80)


def _draw_categories(ax, per_category: dict, policies: dict, colours: dict) -> None:
    title = "Rows flagged per category and code (solid: kept in the dataset; hatched: left out)"
    categories = sorted(per_category)
    codes = [c for c in CODES if any(sum(per_category[cat][c]) for cat in categories)]
    if not codes:
        _nothing(ax, title)
        return
    width = 0.8 / len(codes)
    for n, code in enumerate(codes):
        x = [i + (n - (len(codes) - 1) / 2) * width for i in range(len(categories))]
        kept = [per_category[cat][code][0] for cat in categories]
        quarantined = [per_category[cat][code][1] for cat in categories]
        policy = policies.get(code, "?")
        ax.bar(x, kept, width, color=colours[code], label=f"{code}: kept (policy {policy})")
        ax.bar(x, quarantined, width, bottom=kept, color=colours[code], alpha=0.45, hatch="//",
               edgecolor="black", linewidth=0.4, label=f"{code}: left out (policy {policy})")  # fmt: skip
    category_axis(ax, categories)
    top = max(sum(per_category[cat][code]) for cat in categories for code in codes)
    ax.set_ylim(0, top * 1.08)  # zero-high hatched bars would pin the axis to their base
    ax.set_ylabel("rows")
    integer_ticks(ax.yaxis)
    ax.set_title(title)
    drawn = [c for c in ax.containers if any(bar.get_height() for bar in c)]  # no legend entry for no bar
    legend_beside(ax, drawn, [c.get_label() for c in drawn])


def _draw_turns(ax, turns: list[int], shares: dict, colours: dict) -> None:
    title = "Share of generated rows flagged, by turn index (all categories)"
    codes = [c for c in CODES if any(shares[c])]
    if not codes:
        _nothing(ax, title)
        return
    width = 0.8 / len(codes)
    for n, code in enumerate(codes):
        x = [t + (n - (len(codes) - 1) / 2) * width for t in turns]
        ax.bar(x, shares[code], width, color=colours[code], label=code)
    if len(turns) <= TICK_EVERY_TURN:
        ax.set_xticks(turns, [str(t) for t in turns])
    else:
        integer_ticks(ax.xaxis)
    ax.set_xlabel("turn index")
    ax.set_ylabel("share of the turn's generated rows")
    percent_ticks(ax.yaxis)
    ax.set_title(title)
    legend_beside(ax)


def draw_quality(summary: pd.DataFrame, turns: pd.DataFrame, policies: dict):
    """The quality figure (unsaved): flags per category, kept against quarantined, and per turn."""
    plt = pyplot()
    per_category = flags_by_category(summary)
    turn_index, shares = flag_shares_by_turn(turns)
    colours = {code: f"C{i}" for i, code in enumerate(CODES)}
    fig, axes = plt.subplots(2, 1, figsize=(11, 8))
    _draw_categories(axes[0], per_category, policies, colours)
    _draw_turns(axes[1], turn_index, shares, colours)
    return fig


def plot_quality(*, summary: Path, turns_summary: Path, quality_png: Path, quality: dict | None = None) -> None:
    """Draw the quality gate's flags per category (kept, quarantined) and per turn index."""
    policies = QualitySettings.from_config(quality).policies
    summary_frame = pd.read_csv(summary, sep="\t")
    turns_frame = pd.read_csv(turns_summary, sep="\t")
    save(draw_quality(summary_frame, turns_frame, policies), quality_png)
    rows, _ = _mode_rows(summary_frame)
    flagged = {code: int(rows[f"flag_{code}"].sum()) for code in CODES}
    log.info("rows flagged per code (policies %s): %s", policies, flagged)
