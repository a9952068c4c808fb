"""Draw how the server carried each category (retractions, cache hits, queueing). Run by rule plot_load, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.plot_load import plot_load

run(plot_load, globals().get("snakemake"))
