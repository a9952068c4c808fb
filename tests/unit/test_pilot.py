"""The pilot: a seeded sample generated into the cache, and a projection of the full run that the
full run then meets (in-process, against the scripted engine with a latency)."""

import json
import logging
import math

import pytest

from conftest import conversations
from eagle3_datagen.engine.backends.scripted import ScriptedBackend
from eagle3_datagen.engine.server.faults import Faults
from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.settings import defaults
from eagle3_datagen.steps.generate import generate
from eagle3_datagen.steps.pilot import pilot_generate, project, project_pilot, sample_keys
from eagle3_datagen.storage.tables import read_rows
from engine_thread import running_engine

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CLIENT = {"concurrency": 8, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
BUDGET = {"max_new_tokens": 96, "min_new_tokens": 4, "reserve_tokens": 2}
PILOT = {"fraction": 0.1, "min_rows": 30}


def talks(n):
    """Conversations of 1 to 3 user turns (the original answers in between are replaced)."""
    rows = conversations(n)
    for i, row in enumerate(rows):
        for k in range(i % 3):
            row["messages"] += [
                {"role": "assistant", "content": "An answer."},
                {"role": "user", "content": f"And {k}?"},
            ]
    return rows


def served(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_sample_is_seeded_and_at_least_min_rows(make_prompts):
    prompts, _ = make_prompts(conversations(50) + [{"id": "bad"}])
    keys, usable = sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=3)
    assert usable == 50 and len(keys) == 8
    assert sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=3)[0] == keys  # reproducible
    assert sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=4)[0] != keys
    assert len(sample_keys(prompts, {"fraction": 0.5, "min_rows": 8}, seed=3)[0]) == 25
    assert len(sample_keys(prompts, {"fraction": 0.5, "min_rows": 80}, seed=3)[0]) == 50  # all it has


def test_the_interval_follows_the_spread_and_vanishes_for_a_census():
    sample = [{"requests": 1, "prompt_tokens": 10, "output_tokens": v, "truncated": 0, "dataset_bytes": 1,
               "generations_bytes": 1} for v in (10, 20, 30, 40)]  # fmt: skip
    total, half = project(sample, 100)["output_tokens"]
    assert total == 2500 and half == pytest.approx(1.96 * math.sqrt(12.91**2 / 4 * 96 / 99) * 100, rel=0.01)
    assert project(sample, 4)["output_tokens"] == (100, 0.0)  # the sample is the category


def test_the_projection_meets_the_full_run_and_the_pilot_is_not_paid_twice(
    make_prompts, qwen3_tokenizer_dir, tmp_path, caplog
):
    caplog.set_level(logging.INFO)  # as a job's logging is set up
    prompts, model = make_prompts(talks(240), max_new_tokens=BUDGET["max_new_tokens"], turns="all")
    record = tmp_path / "record.jsonl"
    backend = ScriptedBackend(str(qwen3_tokenizer_dir))
    with running_engine(backend, faults=Faults(latency_ms=(5, 40), seed=1), record=record) as url:
        engine = defaults("engine", kind="external", external={"urls": [url]})
        common = dict(model=model, sampling=SAMPLING, engine=engine, budget=BUDGET, client=CLIENT)
        run = pilot_generate(
            prompts=prompts,
            pilot_generations=tmp_path / "pilot" / "cat.parquet",
            pilot_run=tmp_path / "pilot" / "cat.json",
            pilot_server_log=tmp_path / "pilot.log",
            category="cat",
            cache_dir=str(tmp_path / "cache"),
            pilot=PILOT,
            seed=7,
            **common,
        )
        [row] = project_pilot(
            categories=["cat"],
            pilot_generations=[tmp_path / "pilot" / "cat.parquet"],
            pilot_run=[tmp_path / "pilot" / "cat.json"],
            projection=tmp_path / "projection.tsv",
            projection_png=tmp_path / "projection.png",
        )
        pilot_requests = [parse_rid(e["rid"])[0] for e in served(record)]
        generate(
            prompts=prompts,
            shard_generations=tmp_path / "full.parquet",
            server_log=tmp_path / "server.log",
            category="cat",
            shard=0,
            max_failed_share=0.0,
            cache_dir=str(tmp_path / "cache"),
            shards=1,
            client=CLIENT,
            **{k: v for k, v in common.items() if k != "client"},
        )
    assert run["sampled"] == 30 and run["usable_conversations"] == 240 and run["client"]["requests"] > 30
    # Like a generate job, the pilot keeps its attempt's own logs beside its declared one.
    [pilot_attempt] = [p for p in (tmp_path / "attempts").iterdir() if p.name.startswith("pilot.")]
    assert "attempt on" in pilot_attempt.read_text() and "(pilot) plan" in pilot_attempt.read_text()
    # The pilot's answers are in the cache: the full run sends every other turn, and none of the pilot's.
    full_requests = [parse_rid(e["rid"])[0] for e in served(record)][len(pilot_requests) :]
    assert not set(full_requests) & set(pilot_requests)
    rows = read_rows(tmp_path / "full.parquet")
    sent = [r for r in rows if r["status"] in ("ok", "failed")]
    assert len(sent) == len(pilot_requests) + len(full_requests)
    # The full run falls inside the projection's stated 95 % intervals.
    actual_tokens = sum(len(r["output_ids"]) for r in sent)
    assert abs(actual_tokens - row["output_tokens"]) <= row["output_tokens_ci95"], (actual_tokens, row)
    assert abs(len(sent) - row["requests"]) <= row["requests_ci95"], (len(sent), row)
    assert 0 < row["output_tokens_ci95"] < 0.5 * row["output_tokens"]  # a real interval, not a blank cheque
    assert row["server_hours"] > 0 and row["gpu_hours"] is None  # an external server: its GPUs are not known
    table = (tmp_path / "projection.tsv").read_text().splitlines()
    assert table[0].split("\t")[:4] == ["category", "conversations", "sampled", "requests"] and table[-1].startswith(
        "total"
    )
    assert (tmp_path / "projection.png").stat().st_size > 0
