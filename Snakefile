from snakemake.utils import min_version

min_version("9.0")


# The embedded demo is the config only of a run that names none: a user's --configfile stands alone,
# with the schema's defaults under it (Snakemake would otherwise merge it over this file).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/tokenize.smk"
include: "rules/generate.smk"
include: "rules/check.smk"
include: "rules/export.smk"
include: "rules/report.smk"
include: "rules/pilot.smk"


rule all:
    default_target: True
    input:
        expand(P["dataset"], category=CATEGORIES),
        P["train"],
        P["vocab_mapping"],
        P["token_freq"],
        P["d2t"],
        P["t2d"],
        P["summary"],
        P["turns_summary"],
        P["turns_png"],
        P["lengths_png"],
        expand(P["verdict_counts"], category=CATEGORIES),
        P["verdicts_png"],
        P["token_share_png"],
        P["finish_reasons_png"],
        P["quality_png"],
        P["load_summary"],
        P["load_png"],
        P["headline"],
