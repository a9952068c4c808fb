import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from eagle3_datagen import workflow as wf
from eagle3_datagen.storage.layout import PATHS as P

# The config (with the schema's defaults filled in), the engine and the category sheet, checked
# before any job: a problem is named by its key, or by the sheet's line and field.
sheet = wf.configure(config, workflow.basedir, workflow.overwrite_configfiles or ["config/config.yaml"])


# On the submitting host of a SLURM run, before any job: fail now, not after a silent wait, when the
# executor cannot read job states (a cluster without an accounting database, MinJobAge too short).
onstart:
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm" and not workflow.dryrun:
        wf.check_slurm_status(workflow.executor_settings)


CATEGORIES = list(sheet["category"])


wildcard_constraints:
    category="[a-z0-9_]+",
    shard="[0-9]+",


def get_category(wildcards):
    return wf.category_row(sheet, wildcards.category)


def get_prompts_file(wildcards):
    return get_category(wildcards)["prompts"]


def get_tokenizer_files(wildcards):
    return f"{config['model']['tokenizer']}/tokenizer_config.json"


def get_model_weights(wildcards):
    """The local model's weights, when the local engine serves a model (they are part of its fingerprint)."""
    return wf.model_weights(config["engine"])


def get_param(name):
    """A rule param, computed for the job's category by workflow.PARAMS (as the scripts' -h does)."""

    def value(wildcards):
        category = getattr(wildcards, "category", None)
        return wf.param(name, config, get_category(wildcards) if category else None)

    value.__name__ = f"get_{name}"
    return value


def get_server_resource(name):
    """A resource (gpu, gres, nodes) of a job that launches the server; a generate job whose plan has
    nothing to send asks for no GPU."""

    def value(wildcards, input):
        return wf.server_resources(config["engine"], getattr(input, "plan", None))[name]

    value.__name__ = f"get_server_{name}"
    return value


def get_generate_job(wildcards):
    return wf.generate_job(config["engine"])


def get_generate_cpus(wildcards):
    return get_generate_job(wildcards)["cpus"]


def get_generate_mem_mb(wildcards):
    return get_generate_job(wildcards)["mem_mb"]


def get_generate_runtime(wildcards):
    return get_generate_job(wildcards)["runtime"]


def get_shard_files(wildcards):
    """Each shard's generations: from a GPU job where its plan sends something, else from the journal
    on the submitting host (rule generate_cached). The plans are a checkpoint's outputs."""
    files = []
    for shard in range(wf.shard_count(get_category(wildcards))):
        plan = checkpoints.plan_generation.get(category=wildcards.category, shard=shard).output.plan
        key = "shard_generations" if wf.plan_sends(plan) else "cached_shard_generations"
        files.append(P[key].format(category=wildcards.category, shard=shard))
    return files


def get_all_plan_files(wildcards):
    return [
        P["plan"].format(category=category, shard=shard)
        for category in CATEGORIES
        for shard in range(wf.shard_count(wf.category_row(sheet, category)))
    ]
