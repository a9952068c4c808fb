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
    params:
        cfg=get_generate_params,
    conda:
        "../envs/engine.yaml"
    script:
        "../scripts/generate.py"
