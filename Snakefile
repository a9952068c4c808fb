from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/tokenize.smk"
include: "rules/generate.smk"
include: "rules/check.smk"
include: "rules/export.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        expand("results/dataset/{category}.jsonl", category=CATEGORIES),
        "results/dataset/train.jsonl",
        "results/summary.tsv",
        "results/plots/lengths.png",
        expand("results/checks/{category}.json", category=CATEGORIES),
        "results/plots/verdicts.png",
        "results/plots/token_share.png",
        "results/plots/finish_reasons.png",
