"""Collect every shard's plan into the cost preview results/plan.tsv. Run by rule preview_generation, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.plan_generation import preview_generation

run(preview_generation, globals().get("snakemake"))
