"""Every rule's script (`script: "../scripts/step.py"`): the step function named like the rule that
runs it (`steps.STEPS`), through the runner. By hand: `eagle3-datagen step RULE -h`."""

from eagle3_datagen.runner import run
from eagle3_datagen.steps import step_function

snakemake = globals()["snakemake"]
run(step_function(snakemake.rule), snakemake)
