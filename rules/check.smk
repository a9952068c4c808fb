rule check_sequences:
    input:
        generations=P["generations"],
    output:
        sequence_report=P["sequence_report"],
    log:
        "logs/check_sequences/{category}.log",
    benchmark:
        "benchmarks/check_sequences/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=get_param("model"),
        batch=get_param("batch"),
    script:
        "../scripts/step.py"


rule check_parsers:
    input:
        generations=P["generations"],
    output:
        verdicts=P["verdicts"],
        verdict_counts=P["verdict_counts"],
    log:
        "logs/check_parsers/{category}.log",
    benchmark:
        "benchmarks/check_parsers/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=get_param("model"),
        batch=get_param("batch"),
    script:
        "../scripts/step.py"
