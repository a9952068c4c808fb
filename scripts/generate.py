"""Generate one shard of a category through SGLang's native /generate. Run by rule generate, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.generate import generate

run(generate, globals().get("snakemake"))
