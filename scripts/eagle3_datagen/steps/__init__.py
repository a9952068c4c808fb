"""The steps: one module per Snakemake rule (or per pair of rules that share their work), each
holding the step function named like its rule. A step imports the layers below, never another step.
"""

# Each rule's step module: `scripts/step.py` runs it under Snakemake, `eagle3-datagen step <rule>` by
# hand; a unit test keeps this table and the rules in step.
STEPS = {
    "build_demo_model": "build_demo_model",
    "tokenize_prompts": "tokenize_prompts",
    "plan_generation": "plan_generation",
    "preview_generation": "plan_generation",
    "pilot_generate": "pilot",
    "project_pilot": "pilot",
    "generate": "generate",
    "merge_shards": "generate",
    "check_sequences": "check_sequences",
    "check_parsers": "check_parsers",
    "export_dataset": "export_dataset",
    "merge_dataset": "export_dataset",
    "vocab_mapping": "vocab_mapping",
    "summarize": "summarize",
    "plot_checks": "plot_checks",
    "plot_quality": "plot_quality",
    "plot_load": "plot_load",
    "headline": "headline",
}

# Rules that run another rule's step with params of their own (generate_cached: generate, sending nothing).
SAME_STEP = {"generate_cached": "generate"}


def step_function(rule: str):
    """The step function of `rule` (its module imported only now: a step's imports are its own)."""
    import importlib

    name = SAME_STEP.get(rule, rule)
    return getattr(importlib.import_module(f"{__name__}.{STEPS[name]}"), name)
