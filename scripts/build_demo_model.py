"""Build the demo's Kimi-K2.5-shaped tokenizer and tiny CPU model. Run by rule build_demo_model, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.build_demo_model import build_demo_model

run(build_demo_model, globals().get("snakemake"))
