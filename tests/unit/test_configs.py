"""Every shipped config validates against the schema, and the engine checks accept it."""

from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from eagle3_datagen.workflow import check_engine, load_sheet

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["config/config.yaml", "config/kimi-k2.5.yaml", "config/qwen3.yaml"]


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_validate(name):
    config = yaml.safe_load((ROOT / name).read_text())
    validate(config, str(ROOT / "schemas" / "config.schema.yaml"))
    check_engine(config["engine"])
    sheet = load_sheet(ROOT / config["categories"])
    validate(sheet, str(ROOT / "schemas" / "categories.schema.yaml"))


def test_unknown_keys_are_rejected():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["sampling"]["temprature"] = 0.7
    with pytest.raises(Exception, match="temprature"):
        validate(config, str(ROOT / "schemas" / "config.schema.yaml"))


def test_production_examples_follow_the_model_cards():
    kimi = yaml.safe_load((ROOT / "config" / "kimi-k2.5.yaml").read_text())
    assert kimi["engine"]["sglang"]["tp_size"] == 8 and kimi["engine"]["sglang"]["trust_remote_code"]
    modes = kimi["model"]["modes"]
    assert modes["thinking"]["chat_template_kwargs"] == {"thinking": True}
    assert modes["instant"]["chat_template_kwargs"] == {"thinking": False}
    # The card's sampling per mode: thinking at temperature 1.0, instant at 0.6, top_p 0.95 in both.
    assert (modes["thinking"]["sampling"]["temperature"], modes["thinking"]["sampling"]["top_p"]) == (1.0, 0.95)
    assert (modes["instant"]["sampling"]["temperature"], modes["instant"]["sampling"]["top_p"]) == (0.6, 0.95)
    qwen = yaml.safe_load((ROOT / "config" / "qwen3.yaml").read_text())["model"]["modes"]
    assert qwen["thinking"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert qwen["instant"]["chat_template_kwargs"] == {"enable_thinking": False}
    # Qwen3's card: thinking 0.6 / 0.95, non-thinking 0.7 / 0.8, top_k 20 in both.
    assert [(m["sampling"]["temperature"], m["sampling"]["top_p"], m["sampling"]["top_k"]) for m in qwen.values()] == [
        (0.6, 0.95, 20),
        (0.7, 0.8, 20),
    ]


def test_a_slurm_run_reads_job_states_with_what_works_or_is_refused_before_any_job():
    from types import SimpleNamespace

    import pytest

    from eagle3_datagen.workflow import check_slurm_status

    def cluster(sacct_rc, min_job_age):
        def run(cmd):
            if cmd.startswith("sacct"):
                return SimpleNamespace(returncode=sacct_rc, stdout="", stderr="Slurm accounting storage is disabled")
            return SimpleNamespace(returncode=0, stdout=f"MinJobAge               = {min_job_age} sec\n", stderr="")

        return run

    settings = SimpleNamespace(status_command="sacct", init_seconds_before_status_checks=40)
    assert check_slurm_status(settings, run=cluster(0, 300)) == "sacct" and settings.status_command == "sacct"
    # No accounting database: squeue, where finished jobs stay visible long enough.
    assert (
        check_slurm_status(settings, run=cluster(1, 300)).startswith("squeue") and settings.status_command == "squeue"
    )
    # ... and a refusal that says what to change where they do not.
    with pytest.raises(ValueError, match="accounting storage is disabled") as refused:
        check_slurm_status(SimpleNamespace(status_command="sacct"), run=cluster(1, 60))
    assert "MinJobAge = 60 s" in str(refused.value) and "slurm-init-seconds-before-status-checks to 20" in str(
        refused.value
    )
    squeue = SimpleNamespace(status_command="squeue", init_seconds_before_status_checks=40)
    with pytest.raises(ValueError, match="MinJobAge = 60 s"):
        check_slurm_status(squeue, run=cluster(0, 60))
    assert check_slurm_status(squeue, run=cluster(0, 300)) == "squeue"


def test_the_cpu_sglang_overlay_validates_over_the_demo_and_matches_the_suites_server():
    """config/sglang-cpu.yaml (make demo-sglang-cpu) laid over the demo as Snakemake merges them,
    launching the server the suite installs with the suite's own CPU settings."""
    from snakemake.utils import update_config

    import sglang_server

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "sglang-cpu.yaml").read_text()))
    validate(config, str(ROOT / "schemas" / "config.schema.yaml"))
    check_engine(config["engine"])
    sglang = config["engine"]["sglang"]
    assert ROOT / sglang["python"] == sglang_server.python()
    assert sglang["extra_args"][: len(sglang_server.CPU_ARGS)] == sglang_server.CPU_ARGS
    assert sglang["extra_args"][-2] == "--max-total-tokens"  # not sized from host memory
    assert {**sglang["env"], "PYTHONPATH": str(ROOT / sglang["env"]["PYTHONPATH"])} == sglang_server.CPU_ENV
    assert sglang["model_path"] == config["model"]["tokenizer"] == "resources/demo_model"
