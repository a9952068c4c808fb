"""Generate a category's pilot sample on the configured engine. Run by rule pilot_generate, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.pilot import pilot_generate

run(pilot_generate, globals().get("snakemake"))
