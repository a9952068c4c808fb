rule export_dataset:
    input:
        generations=P["generations"],
        # The gate: nothing is exported before its sequences passed the checks.
        sequence_report=P["sequence_report"],
    output:
        dataset=P["dataset"],
        dataset_parquet=P["dataset_parquet"],
        rejected=P["rejected"],
    log:
        "logs/export_dataset/{category}.log",
    benchmark:
        "benchmarks/export_dataset/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        export=get_param("export"),
        quality=get_param("quality"),
        batch=get_param("batch"),
    script:
        "../scripts/step.py"


rule merge_dataset:
    input:
        dataset=expand(P["dataset"], category=CATEGORIES),
    output:
        train=P["train"],
    log:
        "logs/merge_dataset.log",
    benchmark:
        "benchmarks/merge_dataset.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/step.py"


rule vocab_mapping:
    input:
        train=P["train"],
        prompts=expand(P["prompts"], category=CATEGORIES),
    output:
        token_freq=P["token_freq"],
        vocab_mapping=P["vocab_mapping"],
        d2t=P["d2t"],
        t2d=P["t2d"],
        vocab_provenance=P["vocab_provenance"],
    log:
        "logs/vocab_mapping.log",
    benchmark:
        "benchmarks/vocab_mapping.tsv"
    localrule: True
    conda:
        "../envs/engine.yaml"
    params:
        export=get_param("export"),
    script:
        "../scripts/step.py"
