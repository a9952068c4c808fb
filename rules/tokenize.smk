rule build_demo_model:
    output:
        demo_weights=P["demo_weights"],
        demo_tokenizer=P["demo_tokenizer"],
    log:
        "logs/build_demo_model.log",
    benchmark:
        "benchmarks/build_demo_model.tsv"
    localrule: True
    conda:
        "../envs/engine.yaml"
    params:
        demo_model=get_param("demo_model"),
    script:
        "../scripts/step.py"


rule tokenize_prompts:
    input:
        source=get_prompts_file,
        tokenizer=get_tokenizer_files,
    output:
        prompts=P["prompts"],
    log:
        "logs/tokenize_prompts/{category}.log",
    benchmark:
        "benchmarks/tokenize_prompts/{category}.tsv"
    localrule: True
    conda:
        "../envs/pipeline.yaml"
    params:
        model=get_param("model"),
        budget=get_param("budget"),
        samples_per_prompt=get_param("samples_per_prompt"),
        seed=get_param("seed"),
        on_bad_rows=get_param("on_bad_rows"),
        max_unexpected_row_share=get_param("max_unexpected_row_share"),
        allow_empty=get_param("allow_empty"),
        reading=get_param("reading"),
        turns=get_param("turns"),
        tool_divergence=get_param("tool_divergence"),
        mode_mix=get_param("mode_mix"),
        batch=get_param("batch"),
    script:
        "../scripts/step.py"
