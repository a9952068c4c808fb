"""Draw how the server carried each category: retractions, cache hits, time queued, requests in flight.
Run by rule plot_load, or by hand (-h)."""

from eagle3_datagen.load_report import load_report
from eagle3_datagen.runner import run

run(load_report, globals().get("snakemake"))
