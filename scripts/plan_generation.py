"""Plan one shard's generation on the CPU: rows to send, already generated, skipped. Run by rule plan_generation, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.plan_generation import plan_generation

run(plan_generation, globals().get("snakemake"))
