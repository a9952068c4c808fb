"""Planning on the CPU: fingerprints, shards, and which rows the journal already holds."""

import json

from conftest import conversations
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.planning import (
    make_builder,
    make_plan,
    open_journal,
    requests_to_send,
    shard_of,
    shard_rows,
)
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.steps.plan_generation import plan_generation, preview_generation
from eagle3_datagen.storage.tables import read_provenance, read_rows

SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
SCRIPTED = defaults("engine", kind="local", local={"backend": "scripted"})


BUDGET = {"max_new_tokens": 32, "min_new_tokens": 4, "reserve_tokens": 2}


def template_for(prompts, model, sampling=SAMPLING):
    """The requests' builder of a prompts table (its template: `.template`)."""
    return make_builder(read_provenance(prompts), ModelProfile.from_config(model), sampling, SCRIPTED, BUDGET)


def test_the_plan_sends_usable_rows_and_counts_the_rest(make_prompts, tmp_path):
    rows = conversations(5) + [{"id": "bad", "messages": []}]
    prompts, model = make_prompts(rows)
    template, journal = template_for(prompts, model), Journal(tmp_path / "j.jsonl")
    plan = make_plan(read_rows(prompts), template, journal)
    to_send = list(requests_to_send(read_rows(prompts), template, journal))
    assert [r.id for r in to_send] == [f"r-{i:03d}" for i in range(5)]
    assert plan.skipped == 1 and plan.reused == 0
    summary = plan.summary()
    assert summary["to_send"] == 5 and summary["prompt_tokens_to_send"] == sum(len(r.prompt_ids) for r in to_send)
    assert summary["max_new_tokens_to_send"] == 5 * 32


def test_journalled_rows_are_reused_only_for_the_same_request(make_prompts, tmp_path):
    prompts, model = make_prompts(conversations(4))
    template = template_for(prompts, model)
    journal = Journal(tmp_path / "j.jsonl")
    first = list(requests_to_send(read_rows(prompts), template, journal))
    done = first[1]
    journal.append(
        {"id": done.id, "sample_index": 0, "fingerprint": done.fingerprint, "status": "ok", "output_ids": [1, 2]}
    )
    journal.append(
        {
            "id": first[2].id,
            "sample_index": 0,
            "fingerprint": first[2].fingerprint,
            "status": "failed",
            "error": "x",
        }
    )
    again = make_plan(read_rows(prompts), template, journal)
    resent = [r.id for r in requests_to_send(read_rows(prompts), template, journal)]
    assert again.reused == 1 and again.to_send == 3 and done.id not in resent  # a failed row is sent again
    assert first[2].id in resent
    # Another temperature is another request: nothing is reused.
    other = make_plan(read_rows(prompts), template_for(prompts, model, {**SAMPLING, "temperature": 0.2}), journal)
    assert other.reused == 0 and other.to_send == 4


def test_the_fingerprint_follows_prompt_seed_and_model(make_prompts):
    prompts, model = make_prompts(conversations(2))
    rows = read_rows(prompts)

    def sent(rows, model):
        return list(requests_to_send(rows, template_for(prompts, model), None))

    base = sent(rows, model)
    assert base[0].fingerprint != base[1].fingerprint
    renamed = sent(rows, {**model, "name": "other"})
    assert renamed[0].fingerprint != base[0].fingerprint
    reseeded = [dict(r, seed=r["seed"] + 1) for r in rows]
    assert sent(reseeded, model)[0].fingerprint != base[0].fingerprint
    assert sent(rows, model)[0].fingerprint == base[0].fingerprint


def test_the_template_comes_from_the_token_facts_without_a_tokenizer(make_prompts):
    prompts, model = make_prompts(conversations(1))
    facts = read_provenance(prompts)
    template = template_for(prompts, model).template
    assert template.stop_token_ids == facts["stop_token_ids"] == [151645]
    assert (
        template.vocab_size == facts["vocab_size"]
        and template.model_fingerprint["tokenizer_sha256"] == facts["tokenizer_sha256"]
    )


def test_shards_partition_rows_stably():
    rows = [{"id": f"x{i}"} for i in range(200)]
    parts = [shard_rows(rows, s, 3) for s in range(3)]
    assert sorted(r["id"] for part in parts for r in part) == sorted(r["id"] for r in rows)
    assert all(parts) and all(shard_of(r["id"], 3) == s for s, part in enumerate(parts) for r in part)
    assert [shard_of(f"x{i}", 3) for i in range(10)] == [shard_of(f"x{i}", 3) for i in range(10)]


def test_a_shard_reuses_what_any_journal_of_its_category_holds(tmp_path):
    with open_journal(tmp_path, "c", 0, 1) as j:
        j.append({"id": "a", "sample_index": 0, "fingerprint": "fa", "status": "ok"})
    with open_journal(tmp_path, "c", 1, 2, read_only=True) as j:
        assert j.reusable("fa") is not None
    assert not (tmp_path / "journal" / "c" / "shard_1-of-2.jsonl").exists()  # read-only opens nothing


def test_plan_files_and_the_preview(make_prompts, tmp_path):
    prompts, model = make_prompts(conversations(6))
    plans = []
    for shard in range(2):
        plans.append(tmp_path / f"plan{shard}.json")
        plan_generation(
            prompts=prompts,
            plan=plans[-1],
            category="cat",
            shard=shard,
            model=model,
            sampling=SAMPLING,
            engine=SCRIPTED,
            cache_dir=str(tmp_path / "cache"),
            shards=2,
            budget=BUDGET,
        )
    written = [json.loads(p.read_text()) for p in plans]
    assert sum(w["to_send"] for w in written) == 6 and {w["shard"] for w in written} == {0, 1}
    preview_generation(plan=plans, preview=tmp_path / "plan.tsv")
    lines = (tmp_path / "plan.tsv").read_text().splitlines()
    assert lines[0].split("\t")[:4] == ["category", "shard", "shards", "to_send"] and len(lines) == 3
