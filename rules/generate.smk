rule plan_generation:
    input:
        prompts="results/prompts/{category}.parquet",
        tokenizer=get_tokenizer_files,
        engine=get_engine_files,
    output:
        plan="results/plan/{category}.json",
    log:
        "logs/plan_generation/{category}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        cfg=get_generate_params,
    script:
        "../scripts/plan_generation.py"


rule preview_generation:
    input:
        plans=expand("results/plan/{category}.json", category=CATEGORIES),
    output:
        preview="results/plan.tsv",
    log:
        "logs/preview_generation.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/preview_generation.py"


rule generate:
    input:
        prompts="results/prompts/{category}.parquet",
        plan="results/plan/{category}.json",
        engine=get_engine_files,
    output:
        generations="results/generations/{category}.parquet",
    log:
        client="logs/generate/{category}.log",
        server="logs/generate/{category}.server.log",
    benchmark:
        "benchmarks/generate/{category}.tsv"
    conda:
        "../envs/engine.yaml"
    threads: get_generate_cpus
    resources:
        gpu=get_generate_gpus,
        mem_mb=get_generate_mem_mb,
        runtime=get_generate_runtime,
    params:
        cfg=get_generate_params,
    script:
        "../scripts/generate.py"
