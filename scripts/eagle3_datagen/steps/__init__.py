"""The steps: one module per Snakemake rule (a module may hold a pair of rules that share their
work, e.g. generate and merge_shards), each holding the step function that `scripts/<rule>.py`
calls with the rule's inputs, outputs and params as keyword arguments.

Imports every layer below: `settings`, `storage`, `tokens`, `demo`, `generation`, `figures`; never
another step (what steps share lives in those layers).
"""

# Each rule's step, by rule name: the module of steps/ that holds it (the function is named like the
# rule). `scripts/step.py` runs it under Snakemake, `eagle3-datagen step <rule>` by hand; a unit
# test keeps this table and the rules in step.
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
