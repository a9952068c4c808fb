"""tokenize_prompts in-process: each bad row is quarantined with file, line and field, or fails the
job under `on_bad_rows: fail`, and nothing else is lost."""

import json
from pathlib import Path

import pytest

from conftest import qwen3_model, tokenize_file
from eagle3_datagen.steps.tokenize_prompts import BadRows
from eagle3_datagen.storage.tables import read_provenance, read_rows

GOOD = [{"id": f"g-{i}", "messages": [{"role": "user", "content": f"good question {i}"}]} for i in range(3)]
SOURCE = Path("config/prompts/bad.jsonl")

ROW_CASES = [
    ('{"id": "x", "messages": [{"role": "user"', "config/prompts/bad.jsonl:4: malformed JSON"),
    ({"id": "x"}, "config/prompts/bad.jsonl:4: field 'messages': missing"),
    (
        {"id": "x", "messages": [{"role": "wizard", "content": "hi"}]},
        "config/prompts/bad.jsonl:4: field 'messages[0].role': unknown role 'wizard'",
    ),
    (
        {"id": "x", "messages": [{"role": "user", "content": ""}]},
        "config/prompts/bad.jsonl:4: field 'messages[0].content': empty content",
    ),
    (
        b'{"id": "x", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        "config/prompts/bad.jsonl:4: not valid UTF-8",
    ),
    (
        {"id": "g-1", "messages": [{"role": "user", "content": "same id again"}]},
        "config/prompts/bad.jsonl:4: field 'id': duplicate id 'g-1' (first seen at config/prompts/bad.jsonl:2)",
    ),
    (
        {"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": "get_weather"},
        "config/prompts/bad.jsonl:4: field 'tools': expected a list",
    ),
    (
        {"id": "x", "messages": [{"role": "user", "content": "word " * 3000}]},
        "config/prompts/bad.jsonl:4: over-long: the prompt has",
    ),
]


@pytest.fixture
def tokenize(tmp_path, monkeypatch, qwen3_tokenizer_dir):
    """Write rows (a dict as JSON, str or bytes as they are) to config/prompts/bad.jsonl and tokenize."""
    monkeypatch.chdir(tmp_path)

    def run(rows, on_bad_rows="quarantine"):
        SOURCE.parent.mkdir(parents=True, exist_ok=True)
        with open(SOURCE, "wb") as fh:
            for row in rows:
                row = json.dumps(row) if isinstance(row, dict) else row
                fh.write((row if isinstance(row, bytes) else row.encode()) + b"\n")
        return tokenize_file(
            SOURCE,
            Path("results/prompts/bad.parquet"),
            qwen3_model(qwen3_tokenizer_dir, context_length=2048),
            category="bad",
            budget={"max_new_tokens": 48, "min_new_tokens": 16, "reserve_tokens": 2},
            on_bad_rows=on_bad_rows,
        )

    return run


@pytest.mark.parametrize(
    "bad, message", ROW_CASES, ids=["json", "messages", "role", "empty", "utf8", "duplicate", "tools", "over-long"]
)
def test_a_bad_row_is_quarantined_with_file_line_and_field(tokenize, bad, message):
    rows = read_rows(tokenize(GOOD + [bad]))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "skipped"]
    assert message in rows[-1]["reason"]
    assert [r["id"] for r in rows[:3]] == ["g-0", "g-1", "g-2"]  # nothing else lost


def test_on_bad_rows_fail_stops_the_job_listing_every_bad_row(tokenize):
    with pytest.raises(BadRows) as err:
        tokenize(
            GOOD + [{"id": "x"}, {"id": "y", "messages": [{"role": "wizard", "content": "hi"}]}], on_bad_rows="fail"
        )
    text = str(err.value)
    assert "2 of 5 rows of config/prompts/bad.jsonl cannot be used (on_bad_rows: fail)" in text
    assert (
        "config/prompts/bad.jsonl:4: field 'messages'" in text
        and "config/prompts/bad.jsonl:5: field 'messages[0].role'" in text
    )


def test_an_empty_prompts_file_is_an_error_naming_it(tokenize):
    with pytest.raises(ValueError, match="prompts file config/prompts/bad.jsonl is empty"):
        tokenize([])


def test_the_table_carries_the_token_facts_later_steps_need(tokenize):
    facts = read_provenance(tokenize(GOOD))
    assert facts["stop_token_ids"] == [151645] and facts["reasoning_end_id"] == 151668
    assert facts["vocab_size"] == 151669 and len(facts["tokenizer_sha256"]) == 64
    assert facts["params"]["budget"]["max_new_tokens"] == 48


def test_rows_skipped_by_an_unexpected_error_are_counted_and_past_the_limit_fail_the_category(
    tmp_path, monkeypatch, qwen3_tokenizer_dir
):
    """An exception other than a RowError is possibly a bug: its row is skipped and counted apart,
    and when more than max_unexpected_row_share of the rows are, the category fails."""
    from eagle3_datagen.steps.tokenize_prompts import UnexpectedRows
    from eagle3_datagen.storage import prompts
    from eagle3_datagen.storage.prompt_rows import normalize_row

    def buggy(obj, **kwargs):
        if obj["id"] == "g-1":
            raise AttributeError("'NoneType' object has no attribute 'strip'")
        return normalize_row(obj, **kwargs)

    monkeypatch.setattr(prompts, "normalize_row", buggy)
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in GOOD))

    def run(**limit):
        return tokenize_file(source, tmp_path / "prompts.parquet", qwen3_model(qwen3_tokenizer_dir), **limit)

    with pytest.raises(UnexpectedRows, match=r"1 of 3 rows of .*p.jsonl were skipped by an unexpected error") as err:
        run()  # the default limit, 0.01
    assert "p.jsonl:2: unexpected error (a possible bug; the traceback is in the log): AttributeError" in str(err.value)
    out = run(max_unexpected_row_share=0.5)
    assert [r["status"] for r in read_rows(out)] == ["ok", "skipped", "ok"]
    provenance = read_provenance(out)
    assert provenance["unexpected_rows"] == 1 and provenance["params"]["max_unexpected_row_share"] == 0.5
