"""Merge every category's dataset into one deduplicated train.jsonl. Run by rule merge_dataset, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.export_dataset import merge_dataset

run(merge_dataset, globals().get("snakemake"))
