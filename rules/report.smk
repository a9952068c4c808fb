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
