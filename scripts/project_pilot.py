"""Project the full run from every category's pilot. Run by rule project_pilot, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.pilot import project_pilot

run(project_pilot, globals().get("snakemake"))
