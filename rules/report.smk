rule summarize:
    input:
        generations=expand(P["generations"], category=CATEGORIES),
        rejected=expand(P["rejected"], category=CATEGORIES),
        dataset_parquet=expand(P["dataset_parquet"], category=CATEGORIES),
    output:
        summary=report(
            P["summary"],
            caption="../report/summary.rst",
            category="Summary",
        ),
        turns_summary=report(
            P["turns_summary"],
            caption="../report/turns_summary.rst",
            category="Summary",
        ),
        turns_png=report(
            P["turns_png"],
            caption="../report/turns.rst",
            category="Figures",
        ),
        lengths_png=report(
            P["lengths_png"],
            caption="../report/lengths.rst",
            category="Figures",
        ),
    log:
        "logs/summarize.log",
    benchmark:
        "benchmarks/summarize.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
        batch=get_param("batch"),
    script:
        "../scripts/step.py"


rule plot_checks:
    input:
        verdicts=expand(P["verdicts"], category=CATEGORIES),
        generations=expand(P["generations"], category=CATEGORIES),
    output:
        verdicts_png=report(
            P["verdicts_png"],
            caption="../report/verdicts.rst",
            category="Figures",
        ),
        token_share_png=report(
            P["token_share_png"],
            caption="../report/token_share.rst",
            category="Figures",
        ),
        finish_reasons_png=report(
            P["finish_reasons_png"],
            caption="../report/finish_reasons.rst",
            category="Figures",
        ),
    log:
        "logs/plot_checks.log",
    benchmark:
        "benchmarks/plot_checks.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
        batch=get_param("batch"),
    script:
        "../scripts/step.py"


rule plot_quality:
    input:
        summary=P["summary"],
        turns_summary=P["turns_summary"],
    output:
        quality_png=report(
            P["quality_png"],
            caption="../report/quality.rst",
            category="Figures",
        ),
    log:
        "logs/plot_quality.log",
    benchmark:
        "benchmarks/plot_quality.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        quality=get_param("quality"),
    script:
        "../scripts/step.py"


rule plot_load:
    input:
        generations=expand(P["generations"], category=CATEGORIES),
    output:
        load_summary=report(
            P["load_summary"],
            caption="../report/load.rst",
            category="Summary",
        ),
        load_png=report(
            P["load_png"],
            caption="../report/load.rst",
            category="Figures",
        ),
    log:
        "logs/plot_load.log",
    benchmark:
        "benchmarks/plot_load.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
        batch=get_param("batch"),
    script:
        "../scripts/step.py"


# The report's first page: report/workflow.rst puts this file above the workflow graph.
rule headline:
    input:
        summary=P["summary"],
        verdict_counts=expand(P["verdict_counts"], category=CATEGORIES),
        generations=expand(P["generations"], category=CATEGORIES),
        # The pilot's projection, where a pilot ran (snakemake pilot).
        projection=lambda wildcards: [P["projection"]] if Path(P["projection"]).exists() else [],
    output:
        headline=report(P["headline"], caption="../report/headline.rst", category="Summary"),
    log:
        "logs/headline.log",
    benchmark:
        "benchmarks/headline.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
    script:
        "../scripts/step.py"
