"""Export: input_ids = prompt + output, loss_mask marks exactly the output, every row accounted for."""

import json

import pyarrow.parquet as pq
import pytest

from eagle3_datagen.steps.export_dataset import Filters, export_category, merge_dataset, split_rows


def gen(i, *, status="ok", finish="stop", output=(5, 6, 7), error="", turn=0, prompt=None):
    return {
        "id": f"r{i}",
        "sample_index": 0,
        "turn": turn,
        "category": "c",
        "prompt_ids": list(prompt) if prompt is not None else [1, 2, 3, i],
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
    assert counts == {
        "exported": 2,
        "rejected": 0,
        "merge_turns": False,
        "turns_merged": 0,
        "turns_not_merged": {},
        "by_mode": {},
    }
    out = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert out[0]["input_ids"] == [1, 2, 3, 1, 5, 6, 7]
    assert out[0]["loss_mask"] == [0, 0, 0, 0, 1, 1, 1]
    assert out[1]["loss_mask"] == [0] * 4 + [1] * 10
    assert pq.read_table(tmp_path / "c.parquet").to_pylist()[0]["input_ids"] == out[0]["input_ids"]


def test_every_row_lands_in_exactly_one_place():
    rows = [
        gen(1),
        gen(2, status="skipped", output=(), error="over-long"),
        gen(3, status="failed", output=(), error="HTTP 400"),
        gen(4, finish="length"),
    ]
    dataset, rejected = split_rows(rows, Filters.from_config(drop_truncated=True))
    assert [r["id"] for r in dataset] == ["r1"] and dataset[0]["output_ids"] == [5, 6, 7]
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
    assert merge_dataset(dataset=[a, b], train=tmp_path / "train.jsonl") == {"rows": 2, "duplicates_dropped": 1}


def test_unknown_filter_key_is_rejected():
    with pytest.raises(TypeError):
        Filters.from_config({"filters": {"drop_everything": True}})


def test_merged_turns_hold_one_loss_span_per_generated_turn(tmp_path):
    """Turn 1's prompt extends turn 0's sequence: one row, two spans; turn 2's prompt re-renders the
    earlier answers (as Kimi-K2.5's template does): a row of its own, with the reason counted."""
    t0 = gen(1, output=(5, 6), prompt=(1, 2))
    t1 = gen(1, turn=1, output=(8, 9, 10), prompt=(1, 2, 5, 6, 3, 4))
    t2 = gen(1, turn=2, output=(11,), prompt=(1, 2, 6, 3, 4, 8, 9, 10, 3))
    other = gen(2, output=(7,), prompt=(1, 2, 5, 6))  # another conversation: never joined to r1
    for merge in (True, False):
        out = tmp_path / f"merge-{merge}"
        counts = export_category(
            [[t0], [t1, t2], [other]],  # a chain across batches
            Filters.from_config(),
            jsonl=out / "c.jsonl",
            parquet=out / "c.parquet",
            rejected=out / "c.rejected.jsonl",
            merge_turns=merge,
        )
        rows = [json.loads(line) for line in (out / "c.jsonl").read_text().splitlines()]
        generated = sum(len(r["output_ids"]) for r in (t0, t1, t2, other))
        assert sum(sum(r["loss_mask"]) for r in rows) == generated if merge else True
        if not merge:
            assert len(rows) == 4 and counts["turns_merged"] == 0
            continue
        assert [(r["id"], r["turn"], r["turns"]) for r in rows] == [("r1", 0, 2), ("r1", 2, 1), ("r2", 0, 1)]
        first = rows[0]
        assert first["input_ids"] == [1, 2, 5, 6, 3, 4, 8, 9, 10]
        assert first["loss_mask"] == [0, 0, 1, 1, 0, 0, 1, 1, 1]
        # The loss covers exactly the generated ids of each merged turn, at their place.
        loss = [t for t, m in zip(first["input_ids"], first["loss_mask"]) if m]
        assert loss == t0["output_ids"] + t1["output_ids"]
        assert first["n_output_tokens"] == 5 and first["n_prompt_tokens"] == 4
        assert rows[1]["input_ids"] == t2["prompt_ids"] + t2["output_ids"]
        assert counts["turns_merged"] == 1
        assert counts["turns_not_merged"] == {
            "its prompt does not start with the turn before's prompt_ids + output_ids": 1
        }
        assert pq.read_table(out / "c.parquet").column("turns").to_pylist() == [2, 1, 1]


def test_quality_gate_quarantines_by_policy_and_the_summary_counts_every_flag(tmp_path):
    """A looping row and an unexpected stop are quarantined (filtered records with their codes, not
    in the dataset or train.jsonl); an unfinished reasoning is kept (its policy's default) and carries
    its flag; summary.tsv and turns.tsv count each flag once, kept or quarantined."""
    from eagle3_datagen.steps.export_dataset import export_dataset, merge_dataset
    from eagle3_datagen.steps.summarize import summarize
    from eagle3_datagen.storage.tables import GENERATIONS_SCHEMA, write_table

    think, think_end, im_end, eos = 100, 101, 9, 8
    facts = {
        "stop_token_ids": [im_end],
        "stop_set": {"ids": [im_end, eos], "sources": {}},
        "reasoning_start_id": think,
        "reasoning_end_id": think_end,
        "whitespace_ids": [50],
    }
    rows = [
        gen(1, output=(5, think_end, 6, im_end), prompt=(1, think)),  # clean
        gen(2, output=(5,) + (6, 7) * 300, finish="length", prompt=(1, think)),  # loop, unfinished
        gen(3, output=(5, 6, 7) * 3, finish="length", prompt=(1, think)),  # unfinished only: kept
        gen(4, output=(5, think_end, 6, eos), prompt=(1, think)),  # unexpected stop
        gen(5, output=(5, think_end, 50, 50, im_end), prompt=(1, think), turn=1),  # empty answer
        gen(6, status="failed", output=(), error="HTTP 400"),
    ]
    for row in rows:
        row.update(
            sampling="{}", seed=1, max_new_tokens=600, attempts=1, finish_matched=None, messages="[]", tools="[]"
        )
    generations = tmp_path / "generations.parquet"
    write_table(rows, GENERATIONS_SCHEMA, generations, provenance={"prompts": facts})
    out = {n: tmp_path / n for n in ("c.jsonl", "c.parquet", "c.rejected.jsonl", "train.jsonl")}
    export_dataset(
        generations=generations,
        dataset=out["c.jsonl"],
        dataset_parquet=out["c.parquet"],
        rejected=out["c.rejected.jsonl"],
        export={},
        quality={},
    )
    merge_dataset(dataset=[out["c.jsonl"]], train=out["train.jsonl"])
    kept = [json.loads(line) for line in out["train.jsonl"].read_text().splitlines()]
    assert [(r["id"], r["flags"]) for r in kept] == [("r1", []), ("r3", ["unfinished_reasoning"])]
    rejected = {r["id"]: r for r in map(json.loads, out["c.rejected.jsonl"].read_text().splitlines())}
    assert {k: (r["status"], r.get("code")) for k, r in rejected.items()} == {
        "r2": ("filtered", "repetition_loop"),
        "r4": ("filtered", "unexpected_stop"),
        "r5": ("filtered", "empty_answer"),
        "r6": ("failed", None),
    }
    assert rejected["r2"]["flags"] == ["repetition_loop", "unfinished_reasoning"]
    assert (
        rejected["r2"]["reason"].startswith("repetition_loop: the last ")
        and "2-token n-gram" in rejected["r2"]["reason"]
    )
    summary = summarize(
        categories=["c"],
        generations=[generations],
        rejected=[out["c.rejected.jsonl"]],
        dataset_parquet=[out["c.parquet"]],
        summary=tmp_path / "summary.tsv",
        turns_summary=tmp_path / "turns.tsv",
        lengths_png=tmp_path / "lengths.png",
        turns_png=tmp_path / "turns.png",
    )
    row = summary.iloc[0]
    assert (row["ok"], row["filtered"], row["failed"]) == (2, 3, 1)
    assert {
        c: (row[f"flag_{c}"], row[f"quarantined_{c}"])
        for c in ("repetition_loop", "unfinished_reasoning", "empty_answer", "unexpected_stop")
    } == {
        "repetition_loop": (1, 1),
        "unfinished_reasoning": (2, 1),  # r2's loop left it out with both flags
        "empty_answer": (1, 1),
        "unexpected_stop": (1, 1),
    }
    import pandas as pd

    turns = pd.read_csv(tmp_path / "turns.tsv", sep="\t")
    per_turn = turns.groupby("turn")[["flag_empty_answer", "flag_unfinished_reasoning"]].sum()
    assert per_turn.loc[1, "flag_empty_answer"] == 1 and per_turn.loc[0, "flag_empty_answer"] == 0
    assert per_turn.loc[0, "flag_unfinished_reasoning"] == 2
    ok_turn0 = turns[(turns["turn"] == 0) & (turns["status"] == "ok")].iloc[0]
    assert ok_turn0["flag_unfinished_reasoning"] == 1  # the kept one; the other is on the filtered row
