"""A server with another tokenizer than the job's is refused before any of its answers is kept: the
client against the local engine started on a different tokenizer directory, and a whole generate
job against an external server whose tokenizer swaps two ids."""

import json
import logging
import re
import shutil

import pytest

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.client import GenerateClient, run_loop
from eagle3_datagen.generation.identity import AnswerCheck, ServerMismatch
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.settings import ClientSettings, defaults
from eagle3_datagen.steps.generate import generate
from eagle3_datagen.storage.tables import read_rows
from engine_thread import running_engine

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
FAST = dict(backoff_initial_s=0.01, backoff_max_s=0.05, progress_interval_s=0.5)


def served(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def generate_against(url, prompts, model, out, tmp_path, *, max_new_tokens: int) -> None:
    """The generate step of category `cat`, one shard, against the running server at `url`."""
    generate(
        prompts=prompts,
        shard_generations=out,
        server_log=tmp_path / "server.log",
        category="cat",
        shard=0,
        model=model,
        sampling=SAMPLING,
        engine=defaults("engine", kind="external", external={"urls": [url]}),
        budget={"max_new_tokens": max_new_tokens, "min_new_tokens": 4, "reserve_tokens": 2},
        client={"concurrency": 4, "max_retries": 1, **FAST},
        max_failed_share=0.0,
        cache_dir=str(tmp_path / "cache"),
        shards=1,
    )


def refused_rid(message: str) -> str:
    return re.search(r"its answer to rid (\S+):", message).group(1)


def test_the_client_refuses_an_engine_on_another_tokenizer_and_journals_nothing(
    qwen3_tokenizer_dir, qwen3_tokenizer, kimi_tokenizer_dir, kimi_tokenizer, tmp_path
):
    """The engine serves Qwen3's tokenizer, the job has the Kimi-shaped one: their ids 0..151642
    decode alike, their special ids do not."""
    requests = [
        Request(f"q{i}", 0, qwen3_tokenizer.encode(f"Question {i}: what is {i} + {i}?"), 40, i, fingerprint=f"f{i}")
        for i in range(12)
    ]
    template = RequestTemplate(SAMPLING, stop_token_ids=[151645], vocab_size=len(kimi_tokenizer))
    record, journal_path = tmp_path / "record.jsonl", tmp_path / "journal.jsonl"
    check = AnswerCheck(kimi_tokenizer, tokenizer_dir=str(kimi_tokenizer_dir))
    with running_engine(ScriptedBackend(str(qwen3_tokenizer_dir)), record=record) as url:
        settings = ClientSettings.from_config(concurrency=4, **FAST)
        client = GenerateClient([url], template, settings, answer_check=check)
        with Journal(journal_path) as journal, pytest.raises(ServerMismatch) as refused:
            run_loop(client.run(requests, journal))
    message = str(refused.value)
    assert message.startswith(f"{url} answers as another model or tokenizer than the config's")
    assert "first differ at character" in message and f"model.tokenizer {kimi_tokenizer_dir}" in message
    answered = {e["rid"]: e for e in served(record) if e["status"] == 200}
    assert refused_rid(message) in answered  # the server did answer, and that answer was refused
    assert journal_path.read_bytes() == b""  # nothing of it was kept
    assert check.refused == {url: message} and check.agreed.get(url, 0) == 0


@pytest.fixture
def swapped_tokenizer_dir(qwen3_tokenizer_dir, tmp_path):
    """Qwen3's tokenizer with the ids of `<think>` and `</think>` swapped: the same size and
    vocabulary, another tokenizer."""
    out = tmp_path / "swapped_tokenizer"
    shutil.copytree(qwen3_tokenizer_dir, out)
    ids = {"<think>": 151667, "</think>": 151668}
    data = json.loads((out / "tokenizer.json").read_text())
    for token in data["added_tokens"]:
        if token["content"] in ids:
            token["id"] = ids["</think>" if token["content"] == "<think>" else "<think>"]
    (out / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((out / "tokenizer_config.json").read_text())
    decoder = config.get("added_tokens_decoder", {})
    if "151667" in decoder:
        decoder["151667"], decoder["151668"] = decoder["151668"], decoder["151667"]
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_a_generate_job_refuses_an_external_server_with_another_tokenizer(
    make_prompts, swapped_tokenizer_dir, qwen3_tokenizer, tmp_path
):
    prompts, model = make_prompts(conversations(10))
    backend = ScriptedBackend(str(swapped_tokenizer_dir))
    out = tmp_path / "results" / "generations" / "cat" / "shard_0.parquet"
    record = tmp_path / "record.jsonl"
    with running_engine(backend, record=record) as url:
        assert backend.tokenizer.convert_tokens_to_ids("<think>") == qwen3_tokenizer.convert_tokens_to_ids("</think>")
        with pytest.raises(ServerMismatch) as refused:
            generate_against(url, prompts, model, out, tmp_path, max_new_tokens=32)
    message = str(refused.value)
    assert message.startswith(f"cat: {url} answers as another model or tokenizer than the config's")
    assert re.search(r"first differ at character \d+: server .*'<think>|</think>", message)
    assert refused_rid(message) in {e["rid"] for e in served(record) if e["status"] == 200}
    journal = tmp_path / "cache" / "journal" / "cat" / "shard_0-of-1.jsonl"
    assert not journal.exists() or journal.read_bytes() == b""
    assert not out.exists()


def test_held_answers_of_the_right_server_let_a_short_multi_turn_job_finish(
    make_prompts, qwen3_tokenizer_dir, tmp_path, caplog
):
    """Fewer answers than the check wants, and each conversation's next turn waits for its answer to
    be kept: once every request left holds an answer, they are kept, and the turns go on."""
    caplog.set_level(logging.INFO, logger="eagle3_datagen.generation.identity")
    turns = [{"role": r, "content": f"{r} says {i}"} for i, r in enumerate(["user", "assistant"] * 2 + ["user"])]
    prompts, model = make_prompts(
        [{"id": f"c{i}", "messages": turns} for i in range(2)], turns="all", max_new_tokens=256
    )
    out = tmp_path / "results" / "generations" / "cat" / "shard_0.parquet"
    record = tmp_path / "record.jsonl"
    with running_engine(ScriptedBackend(str(qwen3_tokenizer_dir), ramble_rate=0.0), record=record) as url:
        generate_against(url, prompts, model, out, tmp_path, max_new_tokens=256)
    rows = read_rows(out)
    assert sorted((r["id"], r["turn"], r["status"]) for r in rows) == [
        (f"c{i}", turn, "ok") for i in range(2) for turn in range(3)
    ]
    assert len([e for e in served(record) if e["status"] == 200]) == 6
    released = re.findall(r"all (\d) of its answers so far agree", caplog.text)
    assert released and int(released[-1]) == 6  # held each time, never confirmed by 8 answers
