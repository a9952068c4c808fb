"""Join a category's generate shards into one generations table, in prompt order. Run by rule merge_shards, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.generate import merge_shards

run(merge_shards, globals().get("snakemake"))
