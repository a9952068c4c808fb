rule check_sequences:
    input:
        generations="results/generations/{category}.parquet",
        prompts="results/prompts/{category}.parquet",
    output:
        report="results/checks/{category}.sequences.json",
    log:
        "logs/check_sequences/{category}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=config["model"],
    script:
        "../scripts/check_sequences.py"


rule check_parsers:
    input:
        generations="results/generations/{category}.parquet",
        prompts="results/prompts/{category}.parquet",
    output:
        rows="results/checks/{category}.parquet",
        counts="results/checks/{category}.json",
    log:
        "logs/check_parsers/{category}.log",
    benchmark:
        "benchmarks/check_parsers/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=config["model"],
    script:
        "../scripts/check_parsers.py"
