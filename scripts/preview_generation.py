"""Collect every shard's plan into the cost preview results/plan.tsv. Run by rule preview_generation, or by hand (-h)."""

from eagle3_datagen.plan_generation import preview_generation
from eagle3_datagen.runner import run

run(preview_generation, globals().get("snakemake"))
