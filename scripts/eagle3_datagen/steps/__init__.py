"""The steps: one module per Snakemake rule (a module may hold a pair of rules that share their
work, e.g. generate and merge_shards), each holding the step function that `scripts/<rule>.py`
calls with the rule's inputs, outputs and params as keyword arguments.

Imports every layer below: `settings`, `storage`, `tokens`, `demo`, `generation`, `figures`; never
another step (what steps share lives in those layers).
"""
