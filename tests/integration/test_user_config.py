"""A user's --configfile stands alone: nothing of the demo's config/config.yaml is merged under it
(its modes, seed, engine options), though the demo's file sits in the working directory as in a
checkout; what the user's file leaves out is the schema's default."""

import pytest
import yaml
from workdir import Workdir, demo_rows

from eagle3_datagen.settings import schema
from eagle3_datagen.storage.tables import read_provenance

pytestmark = pytest.mark.slow


def user_config(tokenizer) -> dict:
    """A config as a user writes one: the keys without defaults, two modes named their own way."""
    return {
        "categories": "my.tsv",
        "model": {
            "name": "my-model",
            "tokenizer": str(tokenizer),
            "stop_tokens": ["<|im_end|>"],
            "context_length": 2048,
            "modes": {
                "think": {"chat_template_kwargs": {"thinking": True}, "prompt_suffix": ["<think>"]},
                "fast": {"chat_template_kwargs": {"thinking": False}, "prompt_suffix": ["<think>", "</think>"]},
            },
        },
        "engine": {"kind": "local", "local": {"backend": "scripted"}},
        "sampling": {"temperature": 0.7},
        "max_new_tokens": 64,
    }


@pytest.fixture
def workdir(tmp_path, kimi_tokenizer_dir):
    wd = Workdir(
        tmp_path,
        tokenizer=kimi_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"chat": demo_rows("chat", 6)},
    )
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(user_config(kimi_tokenizer_dir), sort_keys=False))
    return wd


def test_a_users_config_gets_its_own_modes_and_the_schemas_defaults(workdir):
    demo = workdir.config
    assert demo["seed"] != schema()["properties"]["seed"]["default"] and set(demo["model"]["modes"]) == {
        "thinking",
        "instant",
    }
    (workdir.path / "my.tsv").write_text(
        "category\tprompts\tmode_mix\nchat\tconfig/prompts/chat.jsonl\tthink:0.5,fast:0.5\n"
    )
    workdir.snakemake("--configfile", str(workdir.path / "my.yaml"), "--cores", "1", "results/prompts/chat.parquet")
    provenance = read_provenance(workdir.path / "results" / "prompts" / "chat.parquet")
    assert set(provenance["modes"]) == {"think", "fast"}
    params = provenance["params"]
    assert params["seed"] == schema()["properties"]["seed"]["default"]  # not the demo's
    assert params["model"]["modes"].keys() == {"think", "fast"} and params["model"]["reasoning_end"] == "</think>"
    assert params["budget"] == {"max_new_tokens": 64, "min_new_tokens": 16, "reserve_tokens": 2}


def test_a_users_config_refuses_the_demos_mode_names(workdir):
    (workdir.path / "my.tsv").write_text("category\tprompts\tmode_mix\nchat\tconfig/prompts/chat.jsonl\tinstant\n")
    proc = workdir.snakemake("--configfile", str(workdir.path / "my.yaml"), "-n", check=False)
    assert proc.returncode != 0
    assert (
        "my.tsv:2: field 'mode_mix': modes 'instant': unknown mode 'instant'; the model's modes are think, fast"
        in proc.stdout + proc.stderr
    )


def test_a_users_config_without_a_required_key_is_refused_by_name(workdir):
    config = yaml.safe_load((workdir.path / "my.yaml").read_text())
    del config["model"]["tokenizer"]
    (workdir.path / "my.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = workdir.snakemake("--configfile", str(workdir.path / "my.yaml"), "-n", check=False)
    assert proc.returncode != 0
    assert "my.yaml: model.tokenizer has no default and must be set" in proc.stdout + proc.stderr
