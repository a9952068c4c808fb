"""Export one category as trainer-ready input_ids/loss_mask rows. Run by rule export_dataset, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.export_dataset import export_dataset

run(export_dataset, globals().get("snakemake"))
