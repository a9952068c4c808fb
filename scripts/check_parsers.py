"""Would the OpenAI chat route give back the exact tokens? A verdict per row; never fails. Run by rule check_parsers, or by hand (-h)."""

from eagle3_datagen.check_parsers import check_parsers
from eagle3_datagen.runner import run

run(check_parsers, globals().get("snakemake"))
