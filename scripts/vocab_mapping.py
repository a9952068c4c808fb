"""Count train.jsonl's loss tokens; write the draft vocabulary for SpecForge and speculators. Run by rule vocab_mapping, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.vocab_mapping import vocab_mapping

run(vocab_mapping, globals().get("snakemake"))
