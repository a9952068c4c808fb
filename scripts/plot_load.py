"""Draw how the server carried each category (retractions, cache hits, queueing). Run by rule plot_load, or by hand (-h)."""

from eagle3_datagen.load_report import plot_load
from eagle3_datagen.runner import run

run(plot_load, globals().get("snakemake"))
