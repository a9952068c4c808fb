rule export_dataset:
    input:
        generations="results/generations/{category}.parquet",
        # The gate: nothing is exported before its sequences passed the checks.
        checked="results/checks/{category}.sequences.json",
    output:
        jsonl="results/dataset/{category}.jsonl",
        parquet="results/dataset/{category}.parquet",
        rejected="results/dataset/{category}.rejected.jsonl",
    log:
        "logs/export_dataset/{category}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        export=config.get("export", {}),
    script:
        "../scripts/export_dataset.py"


rule merge_dataset:
    input:
        datasets=expand("results/dataset/{category}.jsonl", category=CATEGORIES),
    output:
        train="results/dataset/train.jsonl",
    log:
        "logs/merge_dataset.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/merge_dataset.py"
