"""Count every row by status, tokens in and out, and draw the length figure. Run by rule summarize, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.summarize import summarize

run(summarize, globals().get("snakemake"))
