"""The report's figures, drawn from plain data (no file reading): lengths, turns, pilot projection,
parser-check verdicts, reasoning share, finish reasons, server load. Each `draw_*` returns the
figure unsaved (what the tests measure; the steps save it with `base.save`). Imports matplotlib
only, lazily; the steps that gather the data (summarize, plot_checks, plot_load, plot_quality,
project_pilot) import the module of the figure they draw; `base` holds what every figure shares."""
