"""The quality figure: flags per category (kept and quarantined stacked, never swapped) and per turn
index, its legends beside the data, and a sentence where nothing was flagged."""

import pandas as pd
import pytest

from eagle3_datagen.quality.flags import CODES, QualitySettings
from eagle3_datagen.steps.plot_quality import NOTHING_FLAGGED, draw_quality, plot_quality

POLICIES = QualitySettings().policies


def summary_frame(flags: dict, quarantined: dict) -> pd.DataFrame:
    """A summary table: per category, flag_<code> and quarantined_<code> (0 where not given), and a total row."""
    rows = []
    for category in flags:
        row = {"category": category, "rows": 100}
        for code in CODES:
            row[f"flag_{code}"] = flags[category].get(code, 0)
            row[f"quarantined_{code}"] = quarantined[category].get(code, 0)
        rows.append(row)
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "category"}
    return pd.DataFrame(rows + [{"category": "total", **total}])


def turns_frame(cells: list[tuple]) -> pd.DataFrame:
    """A turns table from (category, turn, status, rows, {code: flagged})."""
    return pd.DataFrame(
        [
            {"category": c, "turn": t, "status": s, "reason": "", "rows": n, "output_tokens": 10 * n}
            | {f"flag_{code}": flagged.get(code, 0) for code in CODES}
            for c, t, s, n, flagged in cells
        ]
    )


FLAGS = {"code": {"repetition_loop": 7, "empty_answer": 2}, "math": {"repetition_loop": 3, "unfinished_reasoning": 5}}
QUARANTINED = {"code": {"repetition_loop": 5, "empty_answer": 2}, "math": {"repetition_loop": 3}}
TURNS = [
    ("code", 0, "ok", 40, {"repetition_loop": 1}),
    ("code", 0, "filtered", 10, {"repetition_loop": 5, "empty_answer": 2}),
    ("code", 1, "ok", 20, {"repetition_loop": 1}),
    ("code", 1, "skipped", 30, {}),  # not generated: not in the share's denominator
    ("math", 0, "ok", 30, {"unfinished_reasoning": 5}),
    ("math", 2, "filtered", 4, {"repetition_loop": 3}),
]


def bars(ax) -> dict[str, list]:
    """The axes' bar series by label: (x, bottom, height, hatch) of each bar."""
    return {
        c.get_label(): [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_height(), p.get_hatch()) for p in c]
        for c in ax.containers
    }


def test_each_category_stacks_its_kept_rows_under_its_quarantined_ones():
    fig = draw_quality(summary_frame(FLAGS, QUARANTINED), turns_frame(TURNS), POLICIES)
    by_category, _ = fig.axes
    series = bars(by_category)
    categories = [t.get_text() for t in by_category.get_xticklabels()]
    assert categories == ["code", "math"]  # the total row is not a category
    drawn = [c for c in CODES if any(c in FLAGS[cat] for cat in FLAGS)]
    assert set(series) == {f"{c}: kept (policy {POLICIES[c]})" for c in drawn} | {
        f"{c}: left out (policy {POLICIES[c]})" for c in drawn
    }
    for code in drawn:
        kept = series[f"{code}: kept (policy {POLICIES[code]})"]
        held = series[f"{code}: left out (policy {POLICIES[code]})"]
        for cat, (_, k_bottom, k_height, k_hatch), (_, q_bottom, q_height, q_hatch) in zip(categories, kept, held):
            flagged, left_out = FLAGS[cat].get(code, 0), QUARANTINED[cat].get(code, 0)
            assert (k_bottom, k_height, k_hatch) == (0, flagged - left_out, None), (code, cat)
            assert (q_bottom, q_height, q_hatch) == (flagged - left_out, left_out, "//"), (code, cat)


def test_each_turn_shows_the_share_of_its_generated_rows_each_code_flagged():
    fig = draw_quality(summary_frame(FLAGS, QUARANTINED), turns_frame(TURNS), POLICIES)
    _, by_turn = fig.axes
    series = bars(by_turn)
    generated = {0: 40 + 10 + 30, 1: 20, 2: 4}
    flagged = {}
    for _, turn, _, _, cell in TURNS:
        for code, n in cell.items():
            flagged[(code, turn)] = flagged.get((code, turn), 0) + n
    assert set(series) == {code for code, _ in flagged}
    for code, drawn in series.items():
        assert [h for _, _, h, _ in drawn] == pytest.approx(
            [flagged.get((code, t), 0) / generated[t] for t in sorted(generated)]
        )
        assert [round(x) for x, *_ in drawn] == sorted(generated)  # each bar beside its turn
    assert [t.get_text() for t in by_turn.get_xticklabels()] == ["0", "1", "2"]  # integer ticks only


def test_the_legends_stand_beside_the_data():
    fig = draw_quality(summary_frame(FLAGS, QUARANTINED), turns_frame(TURNS), POLICIES)
    fig.tight_layout()
    fig.canvas.draw()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
        for other in fig.axes:
            assert not legend.get_window_extent().overlaps(other.get_window_extent())


def test_rows_are_counted_in_whole_numbers_and_shares_in_percent():
    few = {"code": {"empty_answer": 1}, "math": {}}  # one row: a plain locator would tick 0.2, 0.4 ...
    fig = draw_quality(summary_frame(few, {"code": {}, "math": {}}), turns_frame(TURNS), POLICIES)
    fig.canvas.draw()
    by_category, by_turn = fig.axes
    low, high = by_category.get_ylim()
    ticks = [v for v in by_category.get_yticks() if low <= v <= high]
    assert ticks and all(float(v).is_integer() for v in ticks)
    assert all(t.get_text().isdigit() for t in by_category.get_yticklabels() if t.get_text())
    assert all(t.get_text().endswith("%") for t in by_turn.get_yticklabels() if t.get_text())
    # A series with no bar has no legend entry: nothing was left out here.
    assert [t.get_text() for t in by_category.get_legend().get_texts()] == [
        f"empty_answer: kept (policy {POLICIES['empty_answer']})"
    ]


def test_nothing_flagged_is_a_sentence_not_an_empty_panel(tmp_path):
    clean = summary_frame({"code": {}, "math": {}}, {"code": {}, "math": {}})
    fig = draw_quality(clean, turns_frame([(c, t, "ok", 10, {}) for c, t, *_ in TURNS]), POLICIES)
    for ax in fig.axes:
        assert not ax.containers and not ax.axison
        assert [" ".join(t.get_text().split()) for t in ax.texts] == [NOTHING_FLAGGED.format(", ".join(CODES))]
    # Only the panel with nothing to draw says so.
    fig = draw_quality(summary_frame(FLAGS, QUARANTINED), turns_frame([("code", 0, "ok", 10, {})]), POLICIES)
    assert fig.axes[0].containers and not fig.axes[0].texts
    assert not fig.axes[1].containers and fig.axes[1].texts


def test_the_step_draws_the_figure_from_the_tables_and_names_missing_columns(tmp_path):
    summary, turns, png = tmp_path / "summary.tsv", tmp_path / "turns.tsv", tmp_path / "plots" / "quality.png"
    summary_frame(FLAGS, QUARANTINED).to_csv(summary, sep="\t", index=False)
    turns_frame(TURNS).to_csv(turns, sep="\t", index=False)
    plot_quality(summary=summary, turns_summary=turns, quality_png=png, quality={"policies": {"empty_answer": "keep"}})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary_frame(FLAGS, QUARANTINED).drop(columns=["quarantined_empty_answer"]).to_csv(summary, sep="\t", index=False)
    with pytest.raises(ValueError, match="quarantined_empty_answer"):
        plot_quality(summary=summary, turns_summary=turns, quality_png=png)
