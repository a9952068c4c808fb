rule plan_generation:
    input:
        prompts="results/prompts/{category}.parquet",
        tokenizer=get_tokenizer_files,
        engine=get_engine_files,
    output:
        plan="results/plan/{category}/shard_{shard}.json",
    log:
        "logs/plan_generation/{category}/shard_{shard}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        cfg=get_generate_params,
    script:
        "../scripts/plan_generation.py"


rule preview_generation:
    input:
        plans=get_all_plan_files,
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
        plan="results/plan/{category}/shard_{shard}.json",
        engine=get_engine_files,
    output:
        generations="results/generations/{category}/shard_{shard}.parquet",
    log:
        client="logs/generate/{category}/shard_{shard}.log",
        server="logs/generate/{category}/shard_{shard}.server.log",
    benchmark:
        "benchmarks/generate/{category}/shard_{shard}.tsv"
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


rule merge_shards:
    input:
        prompts="results/prompts/{category}.parquet",
        shards=get_shard_files,
    output:
        generations="results/generations/{category}.parquet",
    log:
        "logs/merge_shards/{category}.log",
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/merge_shards.py"
