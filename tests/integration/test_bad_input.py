"""Bad input: each case gets a message naming file, line and field, and loses nothing else.

Row-level problems are quarantined (skipped with their reason, the rest goes on) or fail the job,
as `on_bad_rows` says; config and sheet problems stop the workflow before any job runs.
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
        return Workdir(tmp_path, tokenizer=qwen3_tokenizer_dir, model_dir=None, backend="scripted", categories={"bad": rows}, plain_qwen3=True, **overrides)

    return make


def read_prompt_rows(wd):
    from eagle3_datagen.tables import read_rows

    return read_rows(wd.path / PROMPTS)


ROW_CASES = [
    ('{"id": "x", "messages": [{"role": "user"', "config/prompts/bad.jsonl:4: malformed JSON"),
    ({"id": "x"}, "config/prompts/bad.jsonl:4: field 'messages': missing"),
    ({"id": "x", "messages": [{"role": "wizard", "content": "hi"}]}, "config/prompts/bad.jsonl:4: field 'messages[0].role': unknown role 'wizard'"),
    ({"id": "x", "messages": [{"role": "user", "content": ""}]}, "config/prompts/bad.jsonl:4: field 'messages[0].content': empty content"),
    (b'{"id": "x", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "config/prompts/bad.jsonl:4: not valid UTF-8"),
    ({"id": "g-1", "messages": [{"role": "user", "content": "same id again"}]}, "config/prompts/bad.jsonl:4: field 'id': duplicate id 'g-1' (first seen at config/prompts/bad.jsonl:2)"),
    ({"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": "get_weather"}, "config/prompts/bad.jsonl:4: field 'tools': expected a list"),
    ({"id": "x", "messages": [{"role": "user", "content": "word " * 3000}]}, "config/prompts/bad.jsonl:4: over-long: the prompt has"),
]


@pytest.mark.parametrize("bad, message", ROW_CASES, ids=["json", "messages", "role", "empty", "utf8", "duplicate", "tools", "over-long"])
def test_a_bad_row_is_quarantined_with_file_line_and_field(workdir, bad, message):
    wd = workdir(GOOD + [bad])
    wd.snakemake("--cores", "1", PROMPTS)
    rows = read_prompt_rows(wd)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "skipped"]
    assert message in rows[-1]["reason"]
    assert [r["id"] for r in rows[:3]] == ["g-0", "g-1", "g-2"]  # nothing else lost


def test_on_bad_rows_fail_stops_the_job_listing_every_bad_row(workdir):
    wd = workdir(GOOD + [{"id": "x"}, {"id": "y", "messages": [{"role": "wizard", "content": "hi"}]}], on_bad_rows="fail")
    proc = wd.snakemake("--cores", "1", PROMPTS, check=False)
    assert proc.returncode != 0
    log = (wd.path / "logs" / "tokenize_prompts" / "bad.log").read_text()
    assert "2 of 5 rows of config/prompts/bad.jsonl cannot be used (on_bad_rows: fail)" in log
    assert "config/prompts/bad.jsonl:4: field 'messages'" in log and "config/prompts/bad.jsonl:5: field 'messages[0].role'" in log


def test_an_empty_prompts_file_is_an_error_naming_it(workdir):
    wd = workdir([])
    proc = wd.snakemake("--cores", "1", PROMPTS, check=False)
    assert proc.returncode != 0
    assert "prompts file config/prompts/bad.jsonl is empty" in (wd.path / "logs" / "tokenize_prompts" / "bad.log").read_text()


def test_a_missing_prompts_file_is_named_before_anything_runs(workdir):
    wd = workdir(GOOD)
    (wd.path / "config" / "prompts" / "bad.jsonl").unlink()
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0 and "config/prompts/bad.jsonl" in proc.stdout + proc.stderr
    assert "Missing input files" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "sheet, message",
    [
        ("category\tprompts\tmax_new_tokens\nbad\tconfig/prompts/bad.jsonl\tlots\n", "config/categories.tsv:2: field 'max_new_tokens': 'lots' is not of type 'integer'"),
        ("category\tprompts\ntemperature\tconfig/prompts/bad.jsonl\nba/d\tconfig/prompts/bad.jsonl\n", "config/categories.tsv:3: field 'category': 'ba/d' does not match"),
        ("category\tprompts\n..\tconfig/prompts/bad.jsonl\n", "config/categories.tsv:2: field 'category': '..' does not match"),
        ("category\tprompts\tcolour\nbad\tconfig/prompts/bad.jsonl\tred\n", "config/categories.tsv:2: row: Additional properties are not allowed ('colour' was unexpected)"),
        ("category,prompts\nbad,config/prompts/bad.jsonl\n", "the sheet needs the columns 'category' and 'prompts' (tab-separated)"),
    ],
    ids=["type", "slash", "dotdot", "unknown-column", "not-tab-separated"],
)
def test_a_bad_category_sheet_names_line_and_field(workdir, sheet, message):
    wd = workdir(GOOD)
    (wd.path / "config" / "categories.tsv").write_text(sheet)
    proc = wd.snakemake("-n", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


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
    from eagle3_datagen.templating import load_tokenizer

    tok_dir = tmp_path / "custom"
    shutil.copytree(qwen3_tokenizer_dir, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]}
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (tok_dir / "tokenization_custom.py").write_text("from transformers import PreTrainedTokenizerFast\n\nclass CustomTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    profile = ModelProfile(name="custom", tokenizer=str(tok_dir), context_length=4096, stop_tokens=("<|im_end|>",))
    with pytest.raises(ValueError, match="set model.trust_remote_code: true"):
        load_tokenizer(profile)
