"""Would the OpenAI chat route give back the exact tokens? A verdict per row; never fails. Run by rule check_parsers, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.check_parsers import check_parsers

run(check_parsers, globals().get("snakemake"))
