rule generate:
    input:
        prompts="results/prompts/{category}.parquet",
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
    params:
        cfg=get_generate_params,
    script:
        "../scripts/generate.py"
