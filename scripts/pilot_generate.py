"""Generate a category's pilot sample on the configured engine. Run by rule pilot_generate, or by hand (-h)."""

from eagle3_datagen.pilot import pilot_generate
from eagle3_datagen.runner import run

run(pilot_generate, globals().get("snakemake"))
