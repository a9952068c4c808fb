"""Merge every category's dataset into one deduplicated train.jsonl. Run by rule merge_dataset, or by hand (-h)."""

from eagle3_datagen.export_dataset import merge_dataset
from eagle3_datagen.runner import run

run(merge_dataset, globals().get("snakemake"))
