"""Draw the parser-check verdicts, reasoning share and finish reasons. Run by rule plot_checks, or by hand (-h)."""

from eagle3_datagen.figures import plot_checks
from eagle3_datagen.runner import run

run(plot_checks, globals().get("snakemake"))
