"""Every shipped config validates against the schema, and the engine checks accept it; a user's
config stands alone on the schema's defaults; sampling and budgets come from one written order of places."""

import re
from pathlib import Path

import pytest
import yaml

from eagle3_datagen import workflow
from eagle3_datagen.sampling import SAMPLING_PRECEDENCE
from eagle3_datagen.settings import Budget, schema, validate_config
from eagle3_datagen.workflow import check_engine

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["config/config.yaml", "config/kimi-k2.5.yaml", "config/qwen3.yaml"]


def demo() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_validate(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # the sheets' paths are the repository's
    config = yaml.safe_load((ROOT / name).read_text())
    sheet = workflow.configure(config, ROOT)
    assert len(sheet) >= 1 and all(
        workflow.param("sampling", config, workflow.category_row(sheet, c)) for c in sheet.index
    )


def test_unknown_keys_are_rejected():
    config = demo()
    config["sampling"]["temprature"] = 0.7
    with pytest.raises(
        ValueError, match="sampling: Additional properties are not allowed .'temprature' was unexpected"
    ):
        validate_config(config)


def leaves(config: dict, path=()):
    """Every key of a config, as a path; a mode of model.modes is the user's name, so model.modes is one key."""
    for key, value in config.items():
        if isinstance(value, dict) and path + (key,) != ("model", "modes"):
            yield from leaves(value, path + (key,))
        else:
            yield path + (key,)


def schema_node(path) -> dict:
    node = schema()
    for key in path:
        node = node["properties"][key]
    return node


# Keys a run cannot do without and no default would suit: a config without one is refused, by name.
NO_DEFAULT = {"categories", "model.name", "model.tokenizer", "model.stop_tokens", "model.context_length", "engine.kind", "max_new_tokens"}  # fmt: skip


@pytest.mark.parametrize("path", list(leaves(demo())), ids=".".join)
def test_a_key_the_user_leaves_out_is_the_schemas_default_never_the_demos(path):
    config = demo()
    parent = config
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    name = ".".join(path)
    if name in NO_DEFAULT:
        with pytest.raises(ValueError, match=f"{name} has no default and must be set"):
            validate_config(config)
        return
    validate_config(config)
    value = config
    for key in path:
        value = value.get(key)
    node = schema_node(path)
    if name == "engine.local.model_dir":  # null: the model folder that holds the tokenizer
        assert node["default"] is None and value == config["model"]["tokenizer"]
    elif name == "sampling.temperature":  # no default: each mode of the demo gives its own
        assert "default" not in node
        assert {m: s["temperature"] for m, s in workflow.param("sampling", config, {}).items()} == {
            m: spec["sampling"]["temperature"] for m, spec in config["model"]["modes"].items()
        }
    else:
        assert value == node["default"], name


def test_every_key_without_a_default_is_refused_by_name_at_once():
    config = {"engine": {"kind": "local"}}
    with pytest.raises(ValueError) as refused:
        validate_config(config, "my.yaml")
    for name in NO_DEFAULT - {"engine.kind"}:
        assert f"my.yaml: {name} has no default and must be set" in str(refused.value)
    assert "model.tokenizer has no default and must be set: Directory of the Hugging Face tokenizer" in str(
        refused.value
    )


def test_a_mode_without_a_temperature_anywhere_is_refused_naming_where_to_set_it():
    config = demo()
    del config["sampling"]["temperature"]
    del config["model"]["modes"]["instant"]["sampling"]["temperature"]
    validate_config(config)
    with pytest.raises(ValueError) as refused:
        workflow.param("sampling", config, {"category": "math"})
    message = str(refused.value)
    assert "no temperature for mode 'instant'" in message and "sampling.temperature" in message
    assert "model.modes.instant.sampling.temperature" in message and SAMPLING_PRECEDENCE in message


def test_a_renamed_key_is_named_with_its_new_name(tmp_path):
    config = demo()
    config["modes"] = config.pop("mode_mix")
    with pytest.raises(ValueError, match="key 'modes' is now called 'mode_mix'"):
        validate_config(config)
    sheet = tmp_path / "categories.tsv"
    sheet.write_text("category\tprompts\tmodes\nmath\tp.jsonl\tall\n")
    with pytest.raises(ValueError, match="column 'modes' is now called 'mode_mix'"):
        workflow.validate_sheet(workflow.load_sheet(sheet), ROOT / "schemas" / "categories.schema.yaml", sheet, demo())


def sheet_of(tmp_path, text: str):
    path = tmp_path / "categories.tsv"
    path.write_text(text)
    return path, workflow.load_sheet(path)


def test_a_sampling_cell_of_a_category_that_mixes_modes_names_its_mode(tmp_path):
    """One temperature in a category of two modes would put one at the other's value: refused, with
    the way to write it per mode; per mode, each mode gets its own cell and the others keep theirs."""
    config = validate_config(demo())
    path, sheet = sheet_of(
        tmp_path,
        "category\tprompts\ttemperature\ttop_p\tmode_mix\n"
        "mixed\tp.jsonl\t0.8\t\tthinking:0.5,instant:0.5\n"
        "permode\tp.jsonl\tthinking:0.8,instant:0.3\tinstant:0.5\tall\n"
        "partial\tp.jsonl\tinstant:0.2\t\tall\n"
        "single\tp.jsonl\t0.8\t0.9\tinstant\n"
        "stray\tp.jsonl\tfast:0.8\t\tall\n",
    )
    schema_path = ROOT / "schemas" / "categories.schema.yaml"
    with pytest.raises(ValueError) as refused:
        workflow.validate_sheet(sheet, schema_path, path, config)
    problems = str(refused.value).splitlines()[1:]
    assert len(problems) == 2, problems
    assert f"{path}:2: field 'temperature': the category mixes modes thinking, instant" in problems[0]
    assert "give one per mode (thinking:0.8,instant:0.8)" in problems[0] and SAMPLING_PRECEDENCE in problems[0]
    assert (
        f"{path}:6: field 'temperature': 'fast:0.8' names mode 'fast', which the category does not use" in problems[1]
    )
    modes = config["model"]["modes"]
    got = {
        c: workflow.param("sampling", config, workflow.category_row(sheet, c)) for c in ("permode", "partial", "single")
    }
    assert (got["permode"]["thinking"]["temperature"], got["permode"]["instant"]["temperature"]) == (0.8, 0.3)
    assert (got["permode"]["thinking"]["top_p"], got["permode"]["instant"]["top_p"]) == (modes["thinking"]["sampling"]["top_p"], 0.5)  # fmt: skip
    assert got["partial"]["thinking"] == {**config["sampling"], **modes["thinking"]["sampling"]}
    assert got["partial"]["instant"] == {**config["sampling"], **modes["instant"]["sampling"], "temperature": 0.2}
    assert (got["single"]["instant"]["temperature"], got["single"]["instant"]["top_p"]) == (0.8, 0.9)


def test_production_examples_follow_the_model_cards():
    kimi = yaml.safe_load((ROOT / "config" / "kimi-k2.5.yaml").read_text())
    assert kimi["engine"]["sglang"]["tp_size"] == 8 and kimi["engine"]["sglang"]["trust_remote_code"]
    modes = kimi["model"]["modes"]
    assert modes["thinking"]["chat_template_kwargs"] == {"thinking": True}
    assert modes["instant"]["chat_template_kwargs"] == {"thinking": False}
    # The card's sampling per mode: thinking at temperature 1.0, instant at 0.6, top_p 0.95 in both.
    assert (modes["thinking"]["sampling"]["temperature"], modes["thinking"]["sampling"]["top_p"]) == (1.0, 0.95)
    assert (modes["instant"]["sampling"]["temperature"], modes["instant"]["sampling"]["top_p"]) == (0.6, 0.95)
    # Instant answers get a budget of their own, far below the thinking one.
    assert (
        modes["instant"]["max_new_tokens"] == 8192 < kimi["max_new_tokens"]
        and "max_new_tokens" not in modes["thinking"]
    )
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
    validate_config(config)
    check_engine(config["engine"])
    sglang = config["engine"]["sglang"]
    assert ROOT / sglang["python"] == sglang_server.python()
    assert sglang["extra_args"][: len(sglang_server.CPU_ARGS)] == sglang_server.CPU_ARGS
    assert sglang["extra_args"][-2] == "--max-total-tokens"  # not sized from host memory
    assert {**sglang["env"], "PYTHONPATH": str(ROOT / sglang["env"]["PYTHONPATH"])} == sglang_server.CPU_ENV
    assert sglang["model_path"] == config["model"]["tokenizer"] == "resources/demo_model"


# (mode keys, the category's max_new_tokens cell, run-wide max/min) -> each mode's (max_new_tokens, min_new_tokens)
BUDGETS = [
    ({}, None, (4096, 16), {"thinking": (4096, 16), "instant": (4096, 16)}),
    ({"instant": {"max_new_tokens": 2048}}, None, (32768, 16), {"thinking": (32768, 16), "instant": (2048, 16)}),
    (
        {"instant": {"max_new_tokens": 2048, "min_new_tokens": 64}},
        None,
        (32768, 256),
        {"thinking": (32768, 256), "instant": (2048, 64)},
    ),  # fmt: skip
    ({"thinking": {"min_new_tokens": 1024}}, None, (32768, 16), {"thinking": (32768, 1024), "instant": (32768, 16)}),
    ({"instant": {"max_new_tokens": 2048}}, 8192, (32768, 16), {"thinking": (8192, 16), "instant": (8192, 16)}),
]


@pytest.mark.parametrize("mode_keys, cell, run_wide, expected", BUDGETS)
def test_each_mode_has_its_own_budget_from_one_written_order_of_places(mode_keys, cell, run_wide, expected):
    config = demo()
    config["max_new_tokens"], config["min_new_tokens"] = run_wide
    for mode, keys in mode_keys.items():
        config["model"]["modes"][mode].update(keys)
    validate_config(config)
    category = {"category": "math"} if cell is None else {"category": "math", "max_new_tokens": cell}
    budget = Budget(**workflow.param("budget", config, category))
    got = {mode: (budget.for_mode(mode).max_new_tokens, budget.for_mode(mode).min_new_tokens) for mode in expected}
    assert got == expected
    # A config without budgets per mode keeps the budget it had (its rules' parameters do not change).
    if not mode_keys:
        assert workflow.param("budget", config, category) == {
            "max_new_tokens": run_wide[0] if cell is None else cell,
            "min_new_tokens": run_wide[1],
            "reserve_tokens": config["reserve_tokens"],
        }


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"max_new_tokens": 0}, "model.modes.instant.max_new_tokens: 0 is less than the minimum of 1"),
        ({"max_tokens": 10}, "Additional properties are not allowed ('max_tokens' was unexpected)"),
    ],
)
def test_a_bad_budget_per_mode_is_refused_by_its_key(keys, message):
    config = demo()
    config["model"]["modes"]["instant"].update(keys)
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_config(config)


def test_a_mode_whose_floor_is_above_its_budget_is_refused_before_any_job(tmp_path):
    config = demo()
    config["model"]["modes"]["instant"].update(max_new_tokens=512, min_new_tokens=1024)
    validate_config(config)
    path, sheet = sheet_of(tmp_path, "category\tprompts\tmode_mix\nmath\tp.jsonl\tall\n")
    with pytest.raises(ValueError) as refused:
        workflow.validate_sheet(sheet, ROOT / "schemas" / "categories.schema.yaml", path, config)
    message = str(refused.value)
    assert f"{path}:2: mode 'instant': min_new_tokens 1024 is above max_new_tokens 512" in message
    assert workflow.BUDGET_PRECEDENCE in message


def test_the_two_node_kimi_overlay_asks_for_two_nodes_of_eight_gpus(tmp_path):
    """config/kimi-k2.5-2node.yaml laid over config/kimi-k2.5.yaml, as Snakemake merges them: one
    server across two 8-GPU nodes, each generate job asking SLURM for both."""
    from snakemake.utils import update_config

    from eagle3_datagen.workflow import server_resources

    config = yaml.safe_load((ROOT / "config" / "kimi-k2.5.yaml").read_text())
    update_config(config, yaml.safe_load((ROOT / "config" / "kimi-k2.5-2node.yaml").read_text()))
    validate_config(config)
    check_engine(config["engine"])
    plan = tmp_path / "plan.json"
    plan.write_text('{"to_send": 1}')
    assert server_resources(config["engine"], plan) == {"gpu": 0, "gres": "gpu:8", "nodes": 2}
    assert config["engine"]["sglang"]["extra_args"] == ["--enable-metrics"]  # the base config's, kept
