"""Every step streams a category through bounded batches: the same input gives the same outputs
whatever the batch size (one row at a time included), and tables out of step are refused."""

import itertools
import json

import pyarrow.parquet as pq
import pytest

from conftest import QWEN3_MODEL, conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.settings import defaults
from eagle3_datagen.steps.check_parsers import check_parsers
from eagle3_datagen.steps.check_sequences import check_sequences
from eagle3_datagen.steps.export_dataset import export_dataset, merge_dataset
from eagle3_datagen.steps.generate import generate, merge_shards
from eagle3_datagen.steps.plot_checks import plot_checks
from eagle3_datagen.steps.summarize import summarize
from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts
from eagle3_datagen.storage.tables import (
    GENERATIONS_SCHEMA,
    Batching,
    TableWriter,
    count_rows,
    iter_batches,
    read_provenance,
    read_rows,
    write_table,
)
from engine_thread import running_engine

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CLIENT = {"concurrency": 4, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
CALL = {"id": "functions.add:0", "type": "function", "function": {"name": "add", "arguments": "{}"}}
SHARDS = 2
BUDGET = {"max_new_tokens": 24, "min_new_tokens": 4, "reserve_tokens": 2}


def prompt_file(path):
    rows = conversations(9)
    rows[3]["tools"] = TOOLS
    rows += [{"id": "bad", "messages": "not a list"}, dict(conversations(2)[1])]  # a bad row, a duplicate id
    rows += [{"id": "long", "messages": [{"role": "user", "content": "word " * 3000}]}]  # over the context
    rows += [  # every turn regenerated: three turns, and a tool call answered by its result
        {
            "id": "chat",
            "messages": [
                {"role": role, "content": c}
                for role, c in zip(["user", "assistant"] * 3, ("Hi.", "Hello!", "And then?", "Then this.", "Why?"))
            ],
        },
        {
            "id": "tool",
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": CALL["id"], "content": "5"},
                {"role": "user", "content": "Thanks. And 4 and 5?"},
            ],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_pipeline(root, tokenizer_dir, engine_url, batch):
    """Every local step and the generate job of two categories, in-process, with `batch`."""
    model = defaults("model", **{**QWEN3_MODEL, "tokenizer": str(tokenizer_dir), "context_length": 2048})
    engine = defaults("engine", kind="external", external={"urls": [engine_url]})
    out = {}
    for category in ("alpha", "beta"):
        prompts = root / "prompts" / f"{category}.parquet"
        tokenize_prompts(
            source=prompt_file(root.parent / f"{category}.jsonl"),
            prompts=prompts,
            category=category,
            model=model,
            budget=BUDGET,
            samples_per_prompt=2,
            seed=7,
            on_bad_rows="quarantine",
            turns="all",
            batch=batch,
        )
        shard_files = [root / "generations" / category / f"shard_{n}.parquet" for n in range(SHARDS)]
        for n, shard_file in enumerate(shard_files):
            generate(
                prompts=prompts,
                shard_generations=shard_file,
                server_log=root / "server.log",
                category=category,
                shard=n,
                model=model,
                sampling=SAMPLING,
                engine=engine,
                budget=BUDGET,
                client=CLIENT,
                max_failed_share=0.0,
                cache_dir=str(root.parent / "cache"),  # shared: the second run sends nothing
                shards=SHARDS,
            )
        generations = root / "generations" / f"{category}.parquet"
        merge_shards(prompts=prompts, shard_generations=shard_files, generations=generations, batch=batch)
        check_sequences(
            generations=generations,
            sequence_report=root / "checks" / f"{category}.json",
            model=model,
            batch=batch,
        )
        check_parsers(
            generations=generations,
            verdicts=root / "checks" / f"{category}.verdicts.parquet",
            verdict_counts=root / "checks" / f"{category}.verdicts.json",
            model=model,
            batch=batch,
        )
        export_dataset(
            generations=generations,
            dataset=root / "dataset" / f"{category}.jsonl",
            dataset_parquet=root / "dataset" / f"{category}.parquet",
            rejected=root / "dataset" / f"{category}.rejected.jsonl",
            export={"merge_turns": True, "filters": {"drop_truncated": True, "min_loss_tokens": 1}},
            batch=batch,
        )
        out[category] = generations
    categories = list(out)
    merge_dataset(dataset=[root / "dataset" / f"{c}.jsonl" for c in categories], train=root / "train.jsonl")
    summarize(
        categories=categories,
        generations=list(out.values()),
        rejected=[root / "dataset" / f"{c}.rejected.jsonl" for c in categories],
        dataset_parquet=[root / "dataset" / f"{c}.parquet" for c in categories],
        summary=root / "summary.tsv",
        turns_summary=root / "turns.tsv",
        lengths_png=root / "lengths.png",
        turns_png=root / "turns.png",
        batch=batch,
    )
    plot_checks(
        categories=categories,
        verdicts=[root / "checks" / f"{c}.verdicts.parquet" for c in categories],
        generations=list(out.values()),
        verdicts_png=root / "verdicts.png",
        token_share_png=root / "token_share.png",
        finish_reasons_png=root / "finish_reasons.png",
        batch=batch,
    )
    return root


def tables_of(root):
    return {p.relative_to(root): p for p in sorted(root.rglob("*.parquet"))}


def texts_of(root):
    return {
        p.relative_to(root): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.suffix in (".jsonl", ".tsv", ".json", ".png")
    }


def test_every_step_gives_the_same_outputs_one_row_at_a_time(tmp_path, qwen3_tokenizer_dir):
    with running_engine(ScriptedBackend(str(qwen3_tokenizer_dir)), context_length=2048) as url:
        whole = run_pipeline(tmp_path / "whole", qwen3_tokenizer_dir, url, None)
        tiny = run_pipeline(tmp_path / "tiny", qwen3_tokenizer_dir, url, {"rows": 1, "tokens": 1})
    rows = read_rows(whole / "generations" / "alpha.parquet")
    # 14 conversations x 2 samples, the 3-turn one and the 2-turn tool one with a row per turn.
    assert {r["status"] for r in rows} == {"ok", "skipped"} and len(rows) == 28 + 2 * (2 + 1)
    assert sorted({r["turn"] for r in rows if r["id"] == "chat"}) == [0, 1, 2]
    # Merged in prompt order, the duplicate id included, where the prompts table has it.
    prompt_keys = [(r["id"], r["sample_index"]) for r in read_rows(whole / "prompts" / "alpha.parquet")]
    assert [k for k, _ in itertools.groupby((r["id"], r["sample_index"]) for r in rows)] == [
        k for k, _ in itertools.groupby(prompt_keys)
    ]
    expected_texts = texts_of(whole)
    assert len(expected_texts) >= 12
    assert texts_of(tiny) == expected_texts  # JSONL, summary, reports and figures byte for byte
    for name, path in tables_of(whole).items():
        theirs = tables_of(tiny)[name]
        assert pq.read_table(theirs).equals(pq.read_table(path)), name
    # Batches of one row write one row group per row (the merge: per prompts row): the batches really were small.
    assert pq.read_metadata(tiny / "generations" / "alpha.parquet").num_row_groups == len(prompt_keys)
    assert pq.read_metadata(tiny / "dataset" / "alpha.parquet").num_row_groups == count_rows(
        whole / "dataset" / "alpha.parquet"
    )


def test_batches_keep_to_rows_and_tokens_and_the_first_row_always_fits(tmp_path):
    rows = [
        {"id": str(i), "sample_index": 0, "prompt_ids": [1] * (i % 3), "output_ids": [2] * (i if i > 20 else 1)}
        for i in range(40)
    ]
    path = tmp_path / "g.parquet"
    write_table(rows, GENERATIONS_SCHEMA, path)
    batching = Batching(rows=8, tokens=30)
    batches = list(iter_batches(path, batching))
    assert [r["id"] for b in batches for r in b] == [str(i) for i in range(40)]
    for b in batches:
        tokens = sum(len(r["prompt_ids"]) + len(r["output_ids"]) for r in b)
        assert len(b) <= 8 and (tokens <= 30 or len(b) == 1)
    assert max(len(b) for b in batches) == 8  # short rows: cut by the row count
    assert any(len(b) == 1 for b in batches) and sum(len(b) for b in batches) == 40  # long ones: by tokens


def test_a_writer_left_by_an_error_leaves_no_table(tmp_path):
    path = tmp_path / "out.parquet"
    with pytest.raises(RuntimeError), TableWriter(path, GENERATIONS_SCHEMA, Batching(rows=2)) as writer:
        writer.write({"id": str(i), "sample_index": 0} for i in range(5))
        raise RuntimeError("the job failed")
    assert not path.exists() and not list(tmp_path.iterdir())
    with TableWriter(path, GENERATIONS_SCHEMA, Batching(rows=2)) as writer:
        writer.write({"id": str(i), "sample_index": 0} for i in range(5))
        writer.close({"known": "at the end"})
    assert read_provenance(path) == {"known": "at the end"} and len(read_rows(path)) == 5


def test_long_steps_say_how_far_they_are(caplog):
    import logging

    from eagle3_datagen.storage.tables import logged

    with caplog.at_level(logging.INFO):
        batches = list(logged(([i] * 3 for i in range(4)), 12, "a_step", interval_s=0))
    assert len(batches) == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "a_step"]
    assert lines[0] == "0 of 12 rows" and lines[1].startswith("3 of 12 rows")
    assert lines[-1].startswith("12 of 12 rows done in")
