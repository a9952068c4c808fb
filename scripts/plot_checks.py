"""Draw the parser-check verdicts, reasoning share and finish reasons. Run by rule plot_checks, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.plot_checks import plot_checks

run(plot_checks, globals().get("snakemake"))
