"""The report's figures, drawn from plain data (no file reading): lengths, turns, pilot projection,
parser-check verdicts, reasoning share, finish reasons, server load. Each `draw_*` returns the
figure unsaved (what the tests measure); each `plot_*` draws it and saves it. Imports matplotlib
only, lazily; the steps that gather the data (summarize, plot_checks, plot_load, plot_quality,
project_pilot) call it."""

from eagle3_datagen.figures.base import (
    category_axis,
    empty_panel,
    integer_ticks,
    legend_beside,
    percent_ticks,
    pyplot,
    save,
)
from eagle3_datagen.figures.load import draw_load, plot_load_figure
from eagle3_datagen.figures.projection import draw_projection, plot_projection
from eagle3_datagen.figures.runs import draw_lengths, draw_turns, plot_lengths, plot_turns
from eagle3_datagen.figures.shares import (
    FINISHES,
    draw_finish_reasons,
    draw_token_share,
    draw_verdicts,
    plot_finish_reasons,
    plot_token_share,
    plot_verdicts,
)

# The names the audit step has always imported.
_pyplot, _save = pyplot, save

__all__ = [
    "FINISHES",
    "category_axis",
    "draw_finish_reasons",
    "draw_lengths",
    "draw_load",
    "draw_projection",
    "draw_token_share",
    "draw_turns",
    "draw_verdicts",
    "empty_panel",
    "integer_ticks",
    "legend_beside",
    "percent_ticks",
    "plot_finish_reasons",
    "plot_lengths",
    "plot_load_figure",
    "plot_projection",
    "plot_token_share",
    "plot_turns",
    "plot_verdicts",
    "pyplot",
    "save",
]
