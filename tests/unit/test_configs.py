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
    assert kimi["model"]["chat_template_kwargs"] == {"thinking": True}
    assert (kimi["sampling"]["temperature"], kimi["sampling"]["top_p"]) == (1.0, 0.95)
