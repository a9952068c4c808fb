"""The generate step in-process, against the local engine served from a thread: exactly once, exact
ids, failures accounted, resume from the journal; and merge_shards."""

import json

import pytest

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.engine.server import Faults
from eagle3_datagen.generation.assemble import assemble
from eagle3_datagen.generation.planning import make_builder, make_plan, shard_of
from eagle3_datagen.generation.run import TooManyFailures
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.steps.export_dataset import Filters, split_rows
from eagle3_datagen.steps.generate import merge_shards
from eagle3_datagen.storage.tables import read_provenance, read_rows
from engine_thread import running_engine
from generate_step import SAMPLING, generate_shard

CLIENT = {
    "concurrency": 4,
    "max_retries": 2,
    "backoff_initial_s": 0.01,
    "backoff_max_s": 0.02,
    "progress_interval_s": 0.5,
}


def served(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.fixture
def engine(qwen3_tokenizer_dir, tmp_path):
    """Start an engine (faults optional); returns (engine config, record path)."""
    stack = []

    def start(faults=None):
        record = tmp_path / f"record{len(stack)}.jsonl"
        ctx = running_engine(ScriptedBackend(str(qwen3_tokenizer_dir)), faults=faults, record=record)
        url = ctx.__enter__()
        stack.append(ctx)
        return defaults("engine", kind="external", external={"urls": [url]}), record

    yield start
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


def run_generate(prompts, model, engine_config, tmp_path, *, shard=0, shards=1, max_failed_share=0.0, out=None):
    budget = {"max_new_tokens": 32, "min_new_tokens": 4, "reserve_tokens": 2}
    out = generate_shard(
        prompts,
        model,
        engine_config,
        tmp_path,
        client=CLIENT,
        budget=budget,
        out=out,
        shard=shard,
        shards=shards,
        max_failed_share=max_failed_share,
    )
    return read_rows(out)


def test_every_row_holds_exactly_what_the_server_returned(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(12) + [{"id": "bad", "messages": "x"}])
    engine_config, record = engine()
    rows = run_generate(prompts, model, engine_config, tmp_path)
    assert [r["id"] for r in rows] == [r["id"] for r in read_rows(prompts)]  # prompt order
    by_rid = {e["rid"].rsplit(".", 2)[0]: e for e in served(record) if e["status"] == 200}
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 12 and len(by_rid) == 12
    for r in ok:
        assert r["output_ids"] == by_rid[f"{r['id']}.0"]["output_ids"]
        assert by_rid[f"{r['id']}.0"]["input_ids"] == r["prompt_ids"]
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 1 and "field 'messages'" in skipped[0]["error"]
    provenance = read_provenance(tmp_path / "results" / "generations" / "cat" / "shard_0.parquet")
    assert provenance["plan"]["to_send"] == 12 and provenance["prompts"]["stop_token_ids"] == [151645]
    # The settings `config_sha256` hashes: the step's keyword arguments but its files and which shard it is.
    settings = ["model", "sampling", "engine", "budget", "client", "max_failed_share", "cache_dir", "shards", "quality"]
    assert sorted(provenance["params"]) == sorted(settings)
    # This engine runs without --enable-deterministic-inference: the seeds were not honoured, and it says so.
    assert provenance["seeds_honoured"] is False


def test_a_second_run_sends_nothing_and_gives_the_same_rows(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(6))
    engine_config, record = engine()
    first = run_generate(prompts, model, engine_config, tmp_path)
    n = len(served(record))
    again = run_generate(prompts, model, engine_config, tmp_path)
    assert len(served(record)) == n and again == first


def test_a_journal_left_by_a_killed_job_is_resumed_without_resending(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(10))
    engine_config, record = engine()
    run_generate(prompts, model, engine_config, tmp_path)
    journal = tmp_path / "cache" / "journal" / "cat" / "shard_0-of-1.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2])  # four rows and a torn fifth
    before = len(served(record))
    rows = run_generate(prompts, model, engine_config, tmp_path)
    resent = {e["rid"].rsplit(".", 3)[0] for e in served(record)[before:]}
    kept = {json.loads(line)["id"] for line in lines[:4]}
    assert len(resent) == 6 and not resent & kept
    assert all(r["status"] == "ok" for r in rows) and len({r["id"] for r in rows}) == 10


def test_failed_rows_fail_the_job_above_the_share_and_are_kept_below_it(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(10))
    engine_config, _ = engine(Faults(fail_rids=r"^r-00[26]\."))
    with pytest.raises(
        TooManyFailures, match=r"2 of 10 rows failed .* First failures: r-002.0: gave up after 3 attempts: HTTP 500"
    ):
        run_generate(prompts, model, engine_config, tmp_path)
    rows = run_generate(prompts, model, engine_config, tmp_path, max_failed_share=0.2)
    failed = {r["id"]: r for r in rows if r["status"] == "failed"}
    assert set(failed) == {"r-002", "r-006"} and all(r["attempts"] == 3 for r in failed.values())
    dataset, rejected = split_rows(rows, Filters.from_config())  # what export_dataset accounts
    assert len(dataset) == 8 and {(r["id"], r["status"]) for r in rejected} == {
        ("r-002", "failed"),
        ("r-006", "failed"),
    }
    assert all("HTTP 500" in r["reason"] for r in rejected)
    # With the fault gone only the failed rows are sent again.
    healthy, record = engine()
    rows = run_generate(prompts, model, healthy, tmp_path)
    assert {e["rid"].rsplit(".", 3)[0] for e in served(record)} == {"r-002", "r-006"}
    assert all(r["status"] == "ok" for r in rows)


def test_samples_per_prompt_are_independent_requests_with_their_own_seeds(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(5), samples_per_prompt=2)
    engine_config, record = engine()
    rows = run_generate(prompts, model, engine_config, tmp_path)
    assert sorted((r["id"], r["sample_index"]) for r in rows) == sorted(
        (f"r-{i:03d}", s) for i in range(5) for s in (0, 1)
    )
    seeds = {}
    for r in rows:
        seeds.setdefault(r["id"], set()).add(r["seed"])
    assert all(len(s) == 2 for s in seeds.values())
    requests = served(record)
    assert len(requests) == 10 and all(e["sampling_params"].get("n", 1) == 1 for e in requests)  # never SGLang's n
    assert {e["sampling_params"]["sampling_seed"] for e in requests} == {r["seed"] for r in rows}


def test_shards_generate_apart_and_merge_in_prompt_order(make_prompts, engine, tmp_path):
    prompts, model = make_prompts(conversations(20), samples_per_prompt=2)
    engine_config, record = engine()
    shard_files = []
    for shard in range(3):
        shard_files.append(tmp_path / f"s{shard}.parquet")
        rows = run_generate(prompts, model, engine_config, tmp_path, shard=shard, shards=3, out=shard_files[-1])
        assert rows and all(shard_of(r["id"], 3) == shard for r in rows)
    merged = tmp_path / "merged.parquet"
    merge_shards(prompts=prompts, shard_generations=shard_files, generations=merged)
    rows = read_rows(merged)
    assert [(r["id"], r["sample_index"]) for r in rows] == [(p["id"], p["sample_index"]) for p in read_rows(prompts)]
    assert len(read_provenance(merged)["shards"]) == 3 and len(served(record)) == 40


def test_a_shard_an_older_version_wrote_is_refused_and_made_again_from_its_journal(make_prompts, engine, tmp_path):
    """A shard without a column added since (resumed_at) cannot be merged with newer ones: the merge
    names it and the fix, and making it again from its journal sends nothing."""
    import pyarrow.parquet as pq

    prompts, model = make_prompts(conversations(6))
    engine_config, record = engine()
    shard = tmp_path / "s0.parquet"
    run_generate(prompts, model, engine_config, tmp_path, out=shard)
    sent = len(served(record))
    old = pq.read_table(shard)
    pq.write_table(old.drop_columns(["resumed_at"]).replace_schema_metadata(old.schema.metadata), shard)
    with pytest.raises(RuntimeError, match=r"s0.parquet has no column resumed_at: .*snakemake --forcerun"):
        merge_shards(prompts=prompts, shard_generations=[shard], generations=tmp_path / "merged.parquet")
    run_generate(prompts, model, engine_config, tmp_path, out=shard)
    assert len(served(record)) == sent
    merge_shards(prompts=prompts, shard_generations=[shard], generations=tmp_path / "merged.parquet")
    assert len(read_rows(tmp_path / "merged.parquet")) == len(read_rows(prompts))


def builder_of(prompts, model):
    """The turn builder of a prompts table, for an external server (nothing is launched)."""
    return make_builder(
        read_provenance(prompts),
        ModelProfile.from_config(model),
        SAMPLING,
        defaults("engine", kind="external", external={"urls": ["x"]}),
        {"max_new_tokens": 32, "min_new_tokens": 4, "reserve_tokens": 2},
    )


def test_assemble_keeps_prompt_order_and_every_reason(make_prompts):
    prompts, model = make_prompts(conversations(3) + [{"id": "bad"}])
    prompt_rows = read_rows(prompts)
    builder = builder_of(prompts, model)
    results = {
        ("r-002", 0, 0, "default"): {"status": "failed", "error": "HTTP 400: too long", "attempts": 1},
        ("r-000", 0, 0, "default"): {
            "status": "ok",
            "output_ids": [5, 151645],
            "finish_type": "stop",
            "finish_matched": "151645",
            "attempts": 1,
        },
        ("r-001", 0, 0, "default"): {"status": "ok", "output_ids": [6], "finish_type": "length", "attempts": 2},
    }
    rows = list(assemble(prompt_rows, builder, lambda req: results.get(req.key)))
    assert [(r["id"], r["status"]) for r in rows] == [
        ("r-000", "ok"),
        ("r-001", "ok"),
        ("r-002", "failed"),
        ("bad", "skipped"),
    ]
    assert rows[2]["error"] == "HTTP 400: too long" and "field 'messages'" in rows[3]["error"]
    assert json.loads(rows[0]["sampling"]) == SAMPLING
    with pytest.raises(RuntimeError, match="has no result"):
        list(assemble(prompt_rows, builder, lambda req: None))


def test_a_conversation_that_ends_before_its_first_turn_has_a_row_for_every_turn(make_prompts):
    """Its first prompt does not fit the context: each of its three turns is a skipped row with the
    reason, as for a conversation that stops fitting at a later turn; the plan counts them all."""
    long_first = [
        {"role": "user", "content": "word " * 400},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "thanks"},
    ]
    prompts, model = make_prompts(
        conversations(1) + [{"id": "long", "messages": long_first}], turns="all", context_length=256
    )
    prompt_rows = read_rows(prompts)
    builder = builder_of(prompts, model)
    answer = {"status": "ok", "output_ids": [5, 151645], "finish_type": "stop", "finish_matched": "151645"}
    rows = list(assemble(prompt_rows, builder, lambda req: answer))
    long_rows = [r for r in rows if r["id"] == "long"]
    assert [(r["turn"], r["status"]) for r in long_rows] == [(0, "skipped"), (1, "skipped"), (2, "skipped")]
    assert "over-long" in long_rows[0]["error"]
    assert all(r["error"].startswith("conversation ended: turn 0 was not sent: over-long") for r in long_rows[1:])
    assert make_plan(prompt_rows, builder, None).skipped == 3
