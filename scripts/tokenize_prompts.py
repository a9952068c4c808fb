"""Tokenize one category's prompts with the model's chat template. Run by rule tokenize_prompts, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts

run(tokenize_prompts, globals().get("snakemake"))
