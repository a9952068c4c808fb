"""Generate one shard of a category through SGLang's native /generate. Run by rule generate, or by hand (-h)."""

from eagle3_datagen.generate import generate
from eagle3_datagen.runner import run

run(generate, globals().get("snakemake"))
