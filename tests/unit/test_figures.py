"""The report's figures read well: every legend stands clear of every panel, counts and indices are
labelled with whole numbers only, and a panel with nothing to draw says why in a sentence instead of
showing empty axes. Each figure is drawn from data built here, saved as the pipeline saves it (its
layout included), then measured through matplotlib's own objects."""

import re
from collections import Counter

import pandas as pd
import pytest

from eagle3_datagen.figures import base, load, projection, runs, shares
from eagle3_datagen.steps.plot_checks import VerdictTally
from eagle3_datagen.tokens.chat_layer import VERDICTS

WHOLE = re.compile(r"[−-]?\d{1,3}(,\d{3})*|[−-]?\d+")  # a tick label of a whole number


def saved(fig, tmp_path, name="figure"):
    """The figure after saving it as the pipeline does (its layout included), drawn again on a canvas
    of its own (saving closes it) for its extents."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    base.save(fig, tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    FigureCanvasAgg(fig).draw()
    return fig


def panel_parts(ax, renderer) -> list:
    """The extents of what a panel shows besides its legend: its data area, title, axis labels, tick
    labels and texts."""
    texts = [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels(), *ax.texts]
    shown = [t for t in texts if t.get_visible() and t.get_text()]
    return [ax.get_window_extent(renderer)] * ax.axison + [t.get_window_extent(renderer) for t in shown]


def assert_legends_clear(fig, expected: int = 1) -> None:
    """Every legend lies outside every panel: its data area, tick labels, axis labels, title, texts."""
    renderer = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert len(legends) == expected
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            for part in panel_parts(ax, renderer):
                assert not box.overlaps(part), f"{[t.get_text() for t in legend.get_texts()]} over {ax.get_title()}"


def assert_whole_ticks(axis) -> None:
    """Only whole numbers on the axis: the tick positions in view and their labels."""
    low, high = sorted(axis.get_view_interval())
    positions = [v for v in axis.get_majorticklocs() if low - 1e-9 <= v <= high + 1e-9]
    assert positions and all(float(v).is_integer() for v in positions), positions
    labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
    assert labels and all(WHOLE.fullmatch(t) for t in labels), labels


def assert_sentence(ax, sentence: str) -> None:
    """In place of the plot: the sentence, inside the panel, and nothing drawn."""
    assert not ax.axison
    assert not (ax.patches or ax.lines or ax.collections or ax.containers)
    assert [" ".join(t.get_text().split()) for t in ax.texts] == [sentence]
    renderer = ax.figure.canvas.get_renderer()
    inside, text = ax.get_window_extent(renderer), ax.texts[0].get_window_extent(renderer)
    assert inside.x0 <= text.x0 and text.x1 <= inside.x1, "the sentence spills out of its panel"


def bar_centres(ax) -> list[float]:
    return [p.get_x() + p.get_width() / 2 for c in ax.containers for p in c]


# Small counts: a plain locator would tick these axes at 0.5 steps.
LENGTHS = {"math (thinking)": ([40, 41, 41, 55], [3, 4, 4, 9]), "math (instant)": ([38, 60], [2, 2])}


def test_lengths_share_their_bins_label_whole_numbers_and_keep_the_legend_aside(tmp_path):
    fig = saved(runs.draw_lengths(LENGTHS), tmp_path)
    assert_legends_clear(fig)
    for ax in fig.axes:
        assert_whole_ticks(ax.xaxis)
        assert_whole_ticks(ax.yaxis)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert labels == [f"{name}, n={len(pair[1])}" for name, pair in sorted(LENGTHS.items())]


def test_no_answered_row_is_a_sentence_in_each_length_panel(tmp_path):
    fig = saved(runs.draw_lengths({"math": ([], []), "code": ([], [])}), tmp_path)
    for ax in fig.axes:
        assert_sentence(ax, runs.NO_LENGTHS)


def turns_table(cells) -> pd.DataFrame:
    """A turns table from (series, turn, status, rows, output tokens)."""
    return pd.DataFrame(
        [{"category": c, "turn": t, "status": s, "rows": n, "output_tokens": o} for c, t, s, n, o in cells]
    )


TURNS = [
    ("chat", 0, "ok", 3, 30),
    ("chat", 1, "ok", 1, 9),
    ("chat", 1, "skipped", 2, 0),
    ("chat", 2, "skipped", 1, 0),
    ("code", 0, "ok", 2, 15),
    ("code", 1, "failed", 1, 0),
]


def test_turns_are_whole_indices_with_each_group_around_its_turn(tmp_path):
    fig = saved(runs.draw_turns(turns_table(TURNS)), tmp_path)
    rows, tokens = fig.axes
    for ax in (rows, tokens):
        assert_whole_ticks(ax.xaxis)
        assert_whole_ticks(ax.yaxis)
        assert {round(x) for x in bar_centres(ax)} == {0, 1, 2}
        # Each series keeps one slot beside every turn; the slots stand centred on the turn's tick.
        slots = set()
        for series in ax.containers:
            centres = [p.get_x() + p.get_width() / 2 for p in series]
            offsets = {round(x - round(x), 6) for x in centres}
            assert len(offsets) == 1
            slots |= offsets
        assert len(slots) == 2 and sum(slots) == pytest.approx(0) and max(slots) < 0.45
    assert_legends_clear(fig)
    legend = [t.get_text() for t in tokens.get_legend().get_texts()]
    assert legend == ["chat", "code", runs.NOT_PRODUCED]
    # The rows not produced sit on those produced: the axis holds the highest stack whole.
    assert rows.get_ylim()[1] > 3


def test_turns_without_rows_or_tokens_say_so(tmp_path):
    fig = saved(runs.draw_turns(turns_table([])), tmp_path)
    for ax in fig.axes:
        assert_sentence(ax, runs.NO_TURNS)
    fig = saved(runs.draw_turns(turns_table([("chat", 0, "failed", 2, 0), ("chat", 1, "skipped", 2, 0)])), tmp_path)
    assert fig.axes[0].containers and fig.axes[0].axison
    assert_sentence(fig.axes[1], runs.NO_TOKENS)


TALLIES = {
    "math (thinking)": VerdictTally(Counter(reasoning_dropped_by_template=40, exact=1), 900, 300),
    "math (instant)": VerdictTally(Counter(exact=16), 0, 400),
    "code (instant)": VerdictTally(Counter(exact=44, tool_call_reshaped=4, retokenization_drift=2), 10, 700),
}
FINISHES = {"math (thinking)": (39, 0, 0, 3, 0, 0), "chat": (1, 0, 1, 0, 0, 2)}


@pytest.mark.parametrize(
    "draw",
    [
        lambda: shares.draw_verdicts(TALLIES, VERDICTS),
        lambda: shares.draw_token_share(TALLIES),
        lambda: shares.draw_finish_reasons(FINISHES),
    ],
    ids=["verdicts", "token_share", "finish_reasons"],
)
def test_stacked_bars_keep_their_legend_beside_them(tmp_path, draw):
    fig = saved(draw(), tmp_path)
    (ax,) = fig.axes
    assert ax.containers
    assert_legends_clear(fig)
    # The first series on top, as the legend reads.
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert [label.split(":")[0] for label in labels] == sorted(label.split(":")[0] for label in labels)


def test_shares_read_as_percentages_and_rows_as_whole_numbers(tmp_path):
    verdicts = saved(shares.draw_verdicts(TALLIES, VERDICTS), tmp_path, "verdicts").axes[0]
    assert verdicts.get_xlim() == (0, 1)
    assert all(t.get_text().endswith("%") for t in verdicts.get_xticklabels() if t.get_text())
    assert [t.get_text() for t in verdicts.get_legend().get_texts()] == [
        v for v in VERDICTS if any(t.verdicts.get(v) for t in TALLIES.values())
    ]  # a verdict no row has is left out
    finishes = saved(shares.draw_finish_reasons({"chat": (1, 0, 1, 0, 0, 2)}), tmp_path, "finishes").axes[0]
    assert_whole_ticks(finishes.xaxis)


@pytest.mark.parametrize(
    "draw, sentence",
    [
        (lambda: shares.draw_verdicts({"math": VerdictTally()}, VERDICTS), shares.NO_ROWS),
        (lambda: shares.draw_finish_reasons({"math": (0,) * 6}), shares.NO_ROWS),
        (
            lambda: shares.draw_token_share({"math": VerdictTally()}),
            "No output tokens: " + shares.NO_ROWS.split(": ")[1],
        ),
    ],
    ids=["verdicts", "finish_reasons", "token_share"],
)
def test_no_rows_is_a_sentence_in_the_stacked_figures(tmp_path, draw, sentence):
    assert_sentence(saved(draw(), tmp_path).axes[0], sentence)


def load_frame(rows: list[tuple]) -> pd.DataFrame:
    """A load table from (category, answered, retractions per 1,000, cache-hit share, mean and p90 queue)."""
    keys = ["category", "answered", "retractions_per_1000", "cache_hit_share", "queue_time_mean_s", "queue_time_p90_s"]
    return pd.DataFrame([dict(zip(keys, row)) for row in rows])


TIMELINE = {"t": [0.0, 0.5, 1.0, 1.5], "in_flight": [2, 3, 3, 1], "limit": [2, 3, 3, 3], "running": [2, 2, 3, 1],
            "waiting": [0, 1, 0, None]}  # fmt: skip


def test_a_quiet_server_is_three_sentences_over_the_timelines(tmp_path):
    frame = load_frame([("math", 40, 0.0, 0.0, None, None), ("chat", 10, 0.0, 0.0, None, None)])
    timelines = {"math": [("math", TIMELINE)], "chat": [("chat[0]", TIMELINE), ("chat[1]", TIMELINE)]}
    fig = saved(load.draw_load(frame, timelines), tmp_path)
    retractions, hits, queue, *jobs = fig.axes
    assert_sentence(retractions, load.NO_RETRACTIONS)
    assert_sentence(hits, load.NO_CACHE_HITS)
    assert_sentence(queue, load.NO_QUEUE_TIMES)
    assert [ax.get_title() for ax in jobs] == [
        f"Requests over the run of job {j}" for j in ("math", "chat[0]", "chat[1]")
    ]
    for ax in jobs:
        assert len(ax.lines) == len(load.STYLES)
        assert_whole_ticks(ax.yaxis)
        assert ax.get_ylim() == jobs[0].get_ylim()  # one scale for every job
    assert_legends_clear(fig)


def test_a_loaded_server_draws_its_bars_and_marks_what_was_not_reported(tmp_path):
    frame = load_frame([("math", 40, 12.5, 0.31, 0.4, 1.2), ("chat", 10, 0.0, 0.0, None, None)])
    fig = saved(load.draw_load(frame, {"math": [("math", TIMELINE)]}), tmp_path)
    retractions, hits, queue, job = fig.axes
    assert [p.get_height() for p in retractions.patches] == [12.5, 0.0]
    assert [t.get_text() for t in hits.get_yticklabels() if t.get_text()][-1].endswith("%")
    assert [" ".join(t.get_text().split()) for t in queue.texts] == ["not reported"]
    assert_legends_clear(fig, expected=2)  # mean / 90th percentile, and the timeline's line styles
    assert_whole_ticks(job.yaxis)


def test_no_answer_and_no_job_are_sentences(tmp_path):
    fig = saved(load.draw_load(load_frame([("math", 0, 0.0, 0.0, None, None)]), {}), tmp_path)
    *top, timeline = fig.axes
    for ax in top:
        assert_sentence(ax, load.NO_ANSWERS)
    assert_sentence(timeline, load.NO_TIMELINE)


def projection_rows(hours: bool) -> list[dict]:
    return [
        {"category": c, "output_tokens": 3 + k, "output_tokens_ci95": 1, "gpus_per_server": 8 if hours else 0,
         "server_hours": 0.25 * (k + 1) if hours else None, "server_hours_ci95": 0.05 if hours else None,
         "gpu_hours": 2.0 * (k + 1) if hours else None}
        for k, c in enumerate(("math", "code"))
    ]  # fmt: skip


def test_the_projection_draws_hours_where_the_pilot_measured_a_throughput(tmp_path):
    fig = saved(projection.draw_projection(projection_rows(True), ["math (thinking)", "code"]), tmp_path)
    tokens, hours = fig.axes
    assert_whole_ticks(tokens.yaxis)  # 3 and 4 tokens: whole ticks even so
    assert [p.get_height() for p in hours.patches] == [2.0, 4.0] and "GPU-hours" in hours.get_title()
    assert [t.get_text() for t in tokens.get_xticklabels()] == ["math (thinking)", "code"]
    fig = saved(projection.draw_projection(projection_rows(False)), tmp_path)
    assert fig.axes[0].patches
    assert_sentence(fig.axes[1], projection.NO_THROUGHPUT)
