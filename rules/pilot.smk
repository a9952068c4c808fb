rule pilot_generate:
    input:
        prompts=P["prompts"],
        tokenizer=get_tokenizer_files,
        model_weights=get_model_weights,
    output:
        pilot_generations=P["pilot_generations"],
        pilot_run=P["pilot_run"],
    log:
        "logs/pilot_generate/{category}.log",
        pilot_server_log=P["pilot_server_log"],
    benchmark:
        "benchmarks/pilot_generate/{category}.tsv"
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
        cache_dir=get_param("cache_dir"),
        pilot=get_param("pilot"),
        seed=get_param("seed"),
        quality=get_param("quality"),
    script:
        "../scripts/step.py"


rule project_pilot:
    input:
        pilot_generations=expand(P["pilot_generations"], category=CATEGORIES),
        pilot_run=expand(P["pilot_run"], category=CATEGORIES),
    output:
        projection=report(
            P["projection"],
            caption="../report/projection.rst",
            category="Pilot",
        ),
        projection_png=report(
            P["projection_png"],
            caption="../report/projection_png.rst",
            category="Pilot",
        ),
    log:
        "logs/project_pilot.log",
    benchmark:
        "benchmarks/project_pilot.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        categories=CATEGORIES,
        quality=get_param("quality"),
    script:
        "../scripts/step.py"


# snakemake pilot: a seeded sample of each category on the configured engine, and the projection.
rule pilot:
    input:
        P["projection"],
        P["projection_png"],
