"""Export: input_ids = prompt + output, loss_mask marks exactly the output, every row accounted for."""

import json

import pytest

from eagle3_datagen.export_dataset import Filters, export_category, merge_datasets, split_rows


def gen(i, *, status="ok", finish="stop", output=(5, 6, 7), error=""):
    return {
        "id": f"r{i}",
        "sample_index": 0,
        "category": "c",
        "prompt_ids": [1, 2, 3, i],
        "output_ids": list(output),
        "finish_type": finish,
        "status": status,
        "error": error,
        "seed": 11,
    }


def test_rows_hold_prompt_plus_output_and_mask_only_the_output(tmp_path):
    rows = [gen(1), gen(2, output=(9,) * 10, finish="length")]
    counts = export_category(
        [rows[:1], rows[1:]],  # two batches
        Filters.from_config(),
        jsonl=tmp_path / "c.jsonl",
        parquet=tmp_path / "c.parquet",
        rejected=tmp_path / "c.rejected.jsonl",
    )
    assert counts == {"exported": 2, "rejected": 0}
    out = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert out[0]["input_ids"] == [1, 2, 3, 1, 5, 6, 7]
    assert out[0]["loss_mask"] == [0, 0, 0, 0, 1, 1, 1]
    assert out[1]["loss_mask"] == [0] * 4 + [1] * 10
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "c.parquet").to_pylist()[0]["input_ids"] == out[0]["input_ids"]


def test_every_row_lands_in_exactly_one_place():
    rows = [
        gen(1),
        gen(2, status="skipped", output=(), error="over-long"),
        gen(3, status="failed", output=(), error="HTTP 400"),
        gen(4, finish="length"),
    ]
    dataset, rejected = split_rows(rows, Filters.from_config(drop_truncated=True))
    assert [r["id"] for r in dataset] == ["r1"]
    assert [(r["id"], r["status"]) for r in rejected] == [("r2", "skipped"), ("r3", "failed"), ("r4", "filtered")]
    assert "truncated" in rejected[2]["reason"]


def test_min_loss_tokens_filter():
    dataset, rejected = split_rows([gen(1, output=(5,))], Filters.from_config(min_loss_tokens=2))
    assert not dataset and rejected[0]["status"] == "filtered"


def test_merge_drops_identical_sequences(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(
        json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1]})
        + "\n"
        + json.dumps({"input_ids": [1, 3], "loss_mask": [0, 1]})
        + "\n"
    )
    b.write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1], "id": "dup"}) + "\n")
    assert merge_datasets([a, b], tmp_path / "train.jsonl") == {"rows": 2, "duplicates_dropped": 1}


def test_unknown_filter_key_is_rejected():
    with pytest.raises(TypeError):
        Filters.from_config({"filters": {"drop_everything": True}})
