# A checkpoint: which shards need the GPU is known once their plans are written (merge_shards).
checkpoint plan_generation:
    input:
        prompts=P["prompts"],
        tokenizer=get_tokenizer_files,
        model_weights=get_model_weights,
    output:
        plan=P["plan"],
    log:
        "logs/plan_generation/{category}/shard_{shard}.log",
    benchmark:
        "benchmarks/plan_generation/{category}/shard_{shard}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=get_param("model"),
        sampling=get_param("sampling"),
        engine=get_param("engine"),
        cache_dir=get_param("cache_dir"),
        shards=get_param("shards"),
        budget=get_param("budget"),
        batch=get_param("batch"),
        quality=get_param("quality"),
    script:
        "../scripts/step.py"


rule preview_generation:
    input:
        plan=get_all_plan_files,
    output:
        preview=P["preview"],
    log:
        "logs/preview_generation.log",
    benchmark:
        "benchmarks/preview_generation.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    script:
        "../scripts/step.py"


rule generate:
    input:
        prompts=P["prompts"],
        plan=P["plan"],
        tokenizer=get_tokenizer_files,
        model_weights=get_model_weights,
    output:
        shard_generations=P["shard_generations"],
    log:
        "logs/generate/{category}/shard_{shard}.log",
        server_log=P["server_log"],
    benchmark:
        "benchmarks/generate/{category}/shard_{shard}.tsv"
    conda:
        "../envs/engine.yaml"
    threads: get_generate_cpus
    resources:
        gpu=get_server_resource("gpu"),
        gres=get_server_resource("gres"),
        nodes=get_server_resource("nodes"),
        mem_mb=get_generate_mem_mb,
        runtime=get_generate_runtime,
    params:
        model=get_param("model"),
        sampling=get_param("sampling"),
        engine=get_param("engine"),
        budget=get_param("budget"),
        client=get_param("client"),
        max_failed_share=get_param("max_failed_share"),
        cache_dir=get_param("cache_dir"),
        shards=get_param("shards"),
        quality=get_param("quality"),
    script:
        "../scripts/step.py"


# A shard whose plan sends nothing (every row journalled: rm -r results, or an orphan finished it) is
# assembled from the journal here, on the submitting host: no SLURM job, no GPU.
rule generate_cached:
    input:
        prompts=P["prompts"],
        plan=P["plan"],
        tokenizer=get_tokenizer_files,
        model_weights=get_model_weights,
    output:
        shard_generations=P["cached_shard_generations"],
    log:
        "logs/generate_cached/{category}/shard_{shard}.log",
        server_log="logs/generate_cached/{category}/shard_{shard}.server.log",
    benchmark:
        "benchmarks/generate_cached/{category}/shard_{shard}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=get_param("model"),
        sampling=get_param("sampling"),
        engine=get_param("engine"),
        budget=get_param("budget"),
        client=get_param("client"),
        max_failed_share=get_param("max_failed_share"),
        cache_dir=get_param("cache_dir"),
        shards=get_param("shards"),
        quality=get_param("quality"),
        may_send=False,
    script:
        "../scripts/step.py"


rule merge_shards:
    input:
        prompts=P["prompts"],
        shard_generations=get_shard_files,
    output:
        generations=P["generations"],
    log:
        "logs/merge_shards/{category}.log",
    benchmark:
        "benchmarks/merge_shards/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        batch=get_param("batch"),
    script:
        "../scripts/step.py"
