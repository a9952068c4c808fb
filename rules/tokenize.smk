rule build_demo_model:
    output:
        model=f"{DEMO_MODEL}/model.safetensors",
        tokenizer=f"{DEMO_MODEL}/tokenizer_config.json",
    log:
        "logs/build_demo_model.log",
    benchmark:
        "benchmarks/build_demo_model.tsv"
    localrule: True
    conda:
        "../envs/engine.yaml"
    params:
        steps=config.get("demo_model", {}).get("steps", 120),
        seed=config.get("demo_model", {}).get("seed", 0),
    script:
        "../scripts/build_demo_model.py"


rule tokenize_prompts:
    input:
        prompts=get_prompts_file,
        tokenizer=get_tokenizer_files,
    output:
        prompts="results/prompts/{category}.parquet",
    log:
        "logs/tokenize_prompts/{category}.log",
    benchmark:
        "benchmarks/tokenize_prompts/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        cfg=get_tokenize_params,
    script:
        "../scripts/tokenize_prompts.py"
