"""Check the raw-token invariants of one category's generations; fails on a violation. Run by rule check_sequences, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.check_sequences import check_sequences

run(check_sequences, globals().get("snakemake"))
