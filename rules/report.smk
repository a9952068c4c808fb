rule summarize:
    input:
        generations=expand(
            "results/generations/{category}.parquet", category=CATEGORIES
        ),
        rejected=expand(
            "results/dataset/{category}.rejected.jsonl", category=CATEGORIES
        ),
    output:
        summary=report(
            "results/summary.tsv",
            caption="../report/summary.rst",
            category="Summary",
        ),
        lengths=report(
            "results/plots/lengths.png",
            caption="../report/lengths.rst",
            category="Figures",
        ),
    log:
        "logs/summarize.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
    script:
        "../scripts/summarize.py"


rule plot_checks:
    input:
        checks=expand("results/checks/{category}.parquet", category=CATEGORIES),
        generations=expand(
            "results/generations/{category}.parquet", category=CATEGORIES
        ),
    output:
        verdicts=report(
            "results/plots/verdicts.png",
            caption="../report/verdicts.rst",
            category="Figures",
        ),
        token_share=report(
            "results/plots/token_share.png",
            caption="../report/token_share.rst",
            category="Figures",
        ),
        finish_reasons=report(
            "results/plots/finish_reasons.png",
            caption="../report/finish_reasons.rst",
            category="Figures",
        ),
    log:
        "logs/plot_checks.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
        model=config["model"],
    script:
        "../scripts/plot_checks.py"
