"""Check the raw-token invariants of one category's generations; fails on a violation. Run by rule check_sequences, or by hand (-h)."""

from eagle3_datagen.check_sequences import check_sequences
from eagle3_datagen.runner import run

run(check_sequences, globals().get("snakemake"))
