"""Bad input: each case gets a message naming file, line and field, and loses nothing else.

Config and sheet problems stop the workflow before any job runs (here, through Snakemake). Row-level
problems are the tokenize step's, proven in-process in tests/unit/test_tokenize_prompts.py.
"""

import json

import pytest
from workdir import Workdir

pytestmark = pytest.mark.slow

GOOD = [{"id": f"g-{i}", "messages": [{"role": "user", "content": f"good question {i}"}]} for i in range(3)]
PROMPTS = "results/prompts/bad.parquet"


@pytest.fixture
def workdir(tmp_path, qwen3_tokenizer_dir):
    def make(rows, **overrides):
        return Workdir(
            tmp_path,
            tokenizer=qwen3_tokenizer_dir,
            model_dir=None,
            backend="scripted",
            categories={"bad": rows},
            plain_qwen3=True,
            **overrides,
        )

    return make


def test_a_missing_prompts_file_is_named_before_anything_runs(workdir):
    wd = workdir(GOOD)
    (wd.path / "config" / "prompts" / "bad.jsonl").unlink()
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0 and "config/prompts/bad.jsonl" in proc.stdout + proc.stderr
    assert "Missing input files" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "sheet, message",
    [
        (
            "category\tprompts\tmax_new_tokens\nbad\tconfig/prompts/bad.jsonl\tlots\n",
            "config/categories.tsv:2: field 'max_new_tokens': 'lots' is not of type 'integer'",
        ),
        (
            "category\tprompts\ntemperature\tconfig/prompts/bad.jsonl\nba/d\tconfig/prompts/bad.jsonl\n",
            "config/categories.tsv:3: field 'category': 'ba/d' does not match",
        ),
        (
            "category\tprompts\n..\tconfig/prompts/bad.jsonl\n",
            "config/categories.tsv:2: field 'category': '..' does not match",
        ),
        (
            "category\tprompts\tcolour\nbad\tconfig/prompts/bad.jsonl\tred\n",
            "config/categories.tsv:2: row: Additional properties are not allowed ('colour' was unexpected)",
        ),
        (
            "category,prompts\nbad,config/prompts/bad.jsonl\n",
            "the sheet needs the columns 'category' and 'prompts' (tab-separated)",
        ),
        (
            # (this profile names no modes: its one mode is `default`)
            "category\tprompts\tmode_mix\nbad\tconfig/prompts/bad.jsonl\tdefault:0.7,instnt:0.3\n",
            "config/categories.tsv:2: field 'mode_mix': modes 'default:0.7,instnt:0.3': unknown mode 'instnt'; "
            "the model's modes are default",
        ),
        (
            "category\tprompts\tmode_mix\nbad\tconfig/prompts/bad.jsonl\tdefault:0\n",
            "config/categories.tsv:2: field 'mode_mix': modes 'default:0': the share of 'default' must be a positive number",
        ),
    ],
    ids=["type", "slash", "dotdot", "unknown-column", "not-tab-separated", "unknown-mode", "zero-share"],
)
def test_a_bad_category_sheet_names_line_and_field(workdir, sheet, message):
    wd = workdir(GOOD)
    (wd.path / "config" / "categories.tsv").write_text(sheet)
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


def test_a_config_mix_of_unknown_modes_is_refused_before_any_job(workdir):
    wd = workdir(GOOD)
    wd.config["mode_mix"] = "default:0.5,fast:0.5"
    wd.write_config()
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert "config key mode_mix: modes 'default:0.5,fast:0.5': unknown mode 'fast'" in proc.stdout + proc.stderr


def test_an_unknown_config_key_is_named(workdir):
    wd = workdir(GOOD)
    wd.config["sampling"]["temprature"] = 0.7
    wd.write_config()
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert "'temprature' was unexpected" in proc.stdout + proc.stderr


def test_a_tokenizer_that_does_not_exist_is_named(workdir, tmp_path):
    wd = workdir(GOOD)
    wd.config["model"]["tokenizer"] = str(tmp_path / "no-such-tokenizer")
    wd.write_config()
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert "no-such-tokenizer/tokenizer_config.json" in proc.stdout + proc.stderr


def test_a_tokenizer_with_custom_code_needs_trust_remote_code(tmp_path, qwen3_tokenizer_dir):
    import shutil

    from eagle3_datagen.settings import ModelProfile
    from eagle3_datagen.tokens.vocabulary import load_tokenizer

    tok_dir = tmp_path / "custom"
    shutil.copytree(qwen3_tokenizer_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (tok_dir / "tokenization_custom.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\nclass CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    profile = ModelProfile(name="custom", tokenizer=str(tok_dir), context_length=4096, stop_tokens=("<|im_end|>",))
    with pytest.raises(ValueError, match="set model.trust_remote_code: true"):
        load_tokenizer(profile)
