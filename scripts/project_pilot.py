"""Project the full run from every category's pilot. Run by rule project_pilot, or by hand (-h)."""

from eagle3_datagen.pilot import project_pilot
from eagle3_datagen.runner import run

run(project_pilot, globals().get("snakemake"))
