import sys
from pathlib import Path

from snakemake.utils import validate

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from eagle3_datagen import workflow as wf

validate(config, "../schemas/config.schema.yaml")
wf.check_engine(config["engine"])

sheet = wf.load_sheet(config["categories"])
wf.validate_sheet(
    sheet,
    Path(workflow.basedir) / "schemas" / "categories.schema.yaml",
    config["categories"],
)

CATEGORIES = list(sheet["category"])
DEMO_MODEL = "resources/demo_model"


wildcard_constraints:
    category="[a-z0-9_]+",
    shard="[0-9]+",


def get_category(wildcards):
    return wf.category_row(sheet, wildcards.category)


def get_prompts_file(wildcards):
    return get_category(wildcards)["prompts"]


def get_tokenizer_files(wildcards):
    return f"{config['model']['tokenizer']}/tokenizer_config.json"


def get_engine_files(wildcards):
    engine = config["engine"]
    if engine["kind"] == "local" and engine["local"]["backend"] == "model":
        return f"{engine['local']['model_dir']}/model.safetensors"
    return []


def get_tokenize_params(wildcards):
    return wf.tokenize_params(config, get_category(wildcards))


def get_generate_params(wildcards):
    return wf.generate_params(config, get_category(wildcards))


def get_generate_gpus(wildcards, input):
    """GPUs of a generate job: none when its plan has nothing to send."""
    return wf.generate_gpus(config["engine"], input.plan)


def get_generate_job(wildcards):
    return wf.generate_job(config["engine"])


def get_generate_cpus(wildcards):
    return get_generate_job(wildcards)["cpus"]


def get_generate_mem_mb(wildcards):
    return get_generate_job(wildcards)["mem_mb"]


def get_generate_runtime(wildcards):
    return get_generate_job(wildcards)["runtime"]


def get_shard_files(wildcards):
    shards = wf.shard_count(get_category(wildcards))
    return expand(
        "results/generations/{category}/shard_{shard}.parquet",
        category=wildcards.category,
        shard=range(shards),
    )


def get_all_plan_files(wildcards):
    return [
        f"results/plan/{category}/shard_{shard}.json"
        for category in CATEGORIES
        for shard in range(wf.shard_count(wf.category_row(sheet, category)))
    ]
