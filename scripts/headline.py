"""Write the run's headline (rows kept and left out, tokens, hours, parser checks) for the report's first page. Run by rule headline, or by hand (-h)."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps.headline import headline

run(headline, globals().get("snakemake"))
