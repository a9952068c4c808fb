"""Draw the quality gate's flags per category and per turn. Run by rule plot_quality, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.plot_quality import plot_quality

run(plot_quality, globals().get("snakemake"))
