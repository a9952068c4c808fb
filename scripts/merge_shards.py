"""Join a category's generate shards into one generations table, in prompt order. Run by rule merge_shards, or by hand (-h)."""

from eagle3_datagen.generate import merge_shards
from eagle3_datagen.runner import run

run(merge_shards, globals().get("snakemake"))
