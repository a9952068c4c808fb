"""The live loop stop: streamed /generate answers read chunk by chunk, a loop stopped on the server
with /abort_request, and the row's ids exactly the tokens generated; against a small server that
streams as SGLang 0.5.23 does with --incremental-streaming-output (tokenizer_manager.py
`_handle_batch_output`, `_handle_abort_req`, `_coalesce_streaming_chunks`)."""

import asyncio
import logging
import random
import time
from contextlib import suppress

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from eagle3_datagen.generation.client import GenerateClient
from eagle3_datagen.generation.journal import Journal, loop_rows
from eagle3_datagen.generation.launch import INCREMENTAL_STREAMING_FLAG, local_engine_command, sglang_command
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.run import _live_stop
from eagle3_datagen.generation.server_info import streams_incrementally
from eagle3_datagen.generation.streaming import LiveStop, StreamedAnswer, _events
from eagle3_datagen.quality.flags import LOOP_FINISH, QualitySettings
from eagle3_datagen.quality.loops import LoopSettings, find_loop
from eagle3_datagen.settings import ClientSettings, defaults

VOCAB = 50_000
STOP = 7
LOOP = LoopSettings(min_tokens=64, min_repeats=4, max_period=32)
LIVE = LiveStop(loop=LOOP, stream_interval=8)
FAST = dict(backoff_initial_s=0.01, backoff_max_s=0.02, progress_interval_s=60, max_retries=1)
META = {"cached_tokens": 3, "e2e_latency": 0.5, "num_retractions": 1, "queue_time": 0.25}


def plain_ids(rng: random.Random, n: int) -> list[int]:
    """Ids with no repeated tail: each drawn from a range far larger than the output."""
    return [rng.randrange(100, VOCAB) for _ in range(n)]


def looping(rng: random.Random, onset: int, period: int, budget: int) -> list[int]:
    gram = plain_ids(rng, period)
    out = plain_ids(rng, onset)
    while len(out) < budget:
        out += gram
    return out[:budget]


class FakeSGLang:
    """Answers each rid's planned ids (by row id), streamed incrementally or whole; counts the tokens
    it generated and the aborts it was sent. `late`: delta chunks still sent after an abort arrives;
    `coalesce`: those are joined into the abort's chunk, as a backlog of queued chunks is; `pace_s`: the
    time between chunks. A continuation (the prompt and ids received) is answered with the plan's rest;
    the faults ending in `_once` hit a row's first request only (`stall_once`: no chunk after half of
    the answer until the row's continuation comes). `watched`: a loop waits for the client's abort."""

    def __init__(self, plans: dict, *, late=0, coalesce=False, faults: dict | None = None, pace_s=0.0, watched=True):
        self.plans = plans
        self.late = late
        self.coalesce = coalesce
        self.faults = faults or {}
        self.pace_s = pace_s
        self.watched = watched
        self.arrived: dict[str, float] = {}  # rid: its time.monotonic() of arrival
        self.stalled: dict[str, float] = {}  # row: when its stall began
        self.resumed = asyncio.Event()
        self.generated: dict[str, int] = {}
        self.aborts: list[str] = []
        self.aborted: dict[str, asyncio.Event] = {}
        self.bodies: list[dict] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        return app

    async def abort(self, request):
        rid = (await request.json())["rid"]
        self.aborts.append(rid)
        if rid in self.aborted:
            self.aborted[rid].set()
        return web.Response(status=200)

    def finish(self, ids: list[int], budget: int) -> dict:
        if ids[-1] == STOP:
            return {"type": "stop", "matched": STOP}
        return {"type": "length", "length": budget}

    async def generate(self, request):
        body = await request.json()
        self.bodies.append(body)
        rid, row = body["rid"], body["rid"].split(".")[0]
        budget = body["sampling_params"]["max_new_tokens"]
        came = len(body["input_ids"]) - len(PROMPT)
        ids = self.plans[row][came : came + budget]
        fault = self.faults.get(row)
        if came:
            self.resumed.set()
            fault = None if fault and fault.endswith("_once") else fault
        self.arrived[rid] = time.monotonic()
        if fault == "http400":
            return web.json_response({"error": {"message": "bad input"}}, status=400)
        meta = {"id": rid, "finish_reason": self.finish(ids, budget), "completion_tokens": len(ids), **META}
        if not body.get("stream"):
            self.generated[rid] = len(ids)
            return web.json_response({"text": text_of(ids), "output_ids": ids, "meta_info": meta})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with suppress(ConnectionError):  # a stalled stream's client has gone
            if await self.stream(resp, rid, row, ids, body["sampling_params"]["stream_interval"], meta, fault):
                await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        return resp

    async def stream(self, resp, rid, row, ids, interval, meta, fault) -> None:
        aborted = self.aborted[rid] = asyncio.Event()
        sent, late, backlog = 0, None, []
        while sent < len(ids):
            end = min(len(ids), 1 if sent == 0 else sent + interval)
            self.generated[rid] = end
            chunk = {"text": text_of(ids[sent:end]), "output_ids": ids[sent:end], "meta_info": {"id": rid}}
            if end == len(ids):
                chunk["meta_info"] = meta
            if fault in ("cut", "cut_once") and end > len(ids) // 2:
                return False  # the stream ends with no last chunk
            if fault == "stall_once" and end > len(ids) // 2:
                self.stalled[row] = time.monotonic()
                await self.resumed.wait()
                return False
            if fault == "error" and end > len(ids) // 2:
                await resp.write(b"data: " + orjson.dumps({"error": {"message": "boom", "code": 400}}) + b"\n\n")
                return True
            if late is not None and self.coalesce:
                backlog += ids[sent:end]
            else:
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            sent = end
            if late is not None:
                late -= 1
                if late < 0:
                    break
            elif sent < len(ids):
                # Once the output ends in a loop, wait for the client to see it and abort; else
                # only let the client read the chunk.
                try:
                    await asyncio.wait_for(
                        aborted.wait(), 5.0 if self.watched and find_loop(ids[:sent], LOOP.live()) else 0.001
                    )
                except TimeoutError:
                    await asyncio.sleep(self.pace_s)
                    continue
                late = self.late - 1 if self.late else -1
                if late < 0:
                    break
        if sent < len(ids) or late is not None:
            full = {"text": text_of(ids[:sent]), "output_ids": [*backlog, ids[sent - 1]]}
            full["meta_info"] = {
                "id": rid,
                "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                "completion_tokens": sent,
                "e2e_latency": 0.5,
            }
            await resp.write(b"data: " + orjson.dumps(full) + b"\n\n")
        return True


def text_of(ids):
    return "".join(f"<{i}>" for i in ids)


PROMPT = [1, 2, 3]


def request(row: str, budget: int) -> Request:
    return Request(id=row, sample_index=0, prompt_ids=PROMPT, max_new_tokens=budget, seed=1, fingerprint=row)


def run(server: FakeSGLang, requests, live: LiveStop | None = LIVE, **settings) -> dict:
    async def main():
        async with TestServer(server.app(), host="127.0.0.1") as srv:
            client = GenerateClient(
                [str(srv.make_url("")).rstrip("/")],
                RequestTemplate(sampling={"temperature": 1.0}, stop_token_ids=[STOP], vocab_size=VOCAB),
                ClientSettings.from_config(concurrency=4, **{**FAST, **settings}),
                rng=random.Random(0),
                live=live,
            )
            return await client.run(requests)

    return asyncio.run(main())


def plans_for(seed=0):
    rng = random.Random(seed)
    return {
        "loop": looping(rng, onset=300, period=5, budget=4000),
        "loopy": looping(rng, onset=40, period=17, budget=4000),
        "plain": plain_ids(rng, 999) + [STOP],
        "long": plain_ids(rng, 2000),
    }


def test_a_stream_that_ends_by_itself_gives_exactly_the_non_streamed_answer():
    plans = plans_for()
    requests = [request("plain", 4000), request("long", 2000)]
    whole = run(FakeSGLang(plans), requests, live=None)
    server = FakeSGLang(plans)
    streamed = run(server, requests)
    assert streamed == whole
    assert [r["finish_type"] for r in streamed.values()] == ["stop", "length"]
    assert not server.aborts
    # Streamed, with the chunk size asked for; the fingerprint's params are the same either way.
    assert all(b["stream"] is True and b["sampling_params"]["stream_interval"] == 8 for b in server.bodies)


def test_the_streamed_text_is_the_answers_text():
    ids = plans_for()["plain"]
    answer = StreamedAnswer(request("plain", 4000), VOCAB, LIVE)
    for start in range(0, len(ids), 8):
        chunk = {"text": text_of(ids[start : start + 8]), "output_ids": ids[start : start + 8], "meta_info": {}}
        if start + 8 >= len(ids):
            chunk["meta_info"] = {"finish_reason": {"type": "stop", "matched": STOP}}
        answer.chunk(orjson.dumps(chunk))
    assert orjson.loads(answer.text_answer())["text"] == text_of(ids)
    assert answer.result()["output_ids"] == ids


@pytest.mark.parametrize("late, coalesce", [(0, False), (3, False), (3, True)])
def test_a_loop_is_stopped_live_with_exactly_the_ids_generated_before_the_abort(late, coalesce):
    plans = plans_for()
    server = FakeSGLang(plans, late=late, coalesce=coalesce)
    results = run(server, [request("loop", 4000), request("loopy", 4000), request("plain", 4000)])
    assert sorted(a.split(".")[0] for a in server.aborts) == ["loop", "loopy"]
    for row in ("loop", "loopy"):
        r = results[(row, 0, 0, "default")]
        rid = next(a for a in server.aborts if a.startswith(row + "."))
        n = server.generated[rid]
        assert r["status"] == "ok" and r["finish_type"] == LOOP_FINISH and r["finish_matched"] == ""
        # Exactly the tokens generated, in order: no id of the abort's chunk repeated.
        assert r["output_ids"] == plans[row][:n]
        assert r["completion_tokens"] == n
        assert n < 4000 // 4  # stopped long before its budget
        assert find_loop(r["output_ids"], LOOP) is not None
    assert results[("plain", 0, 0, "default")]["finish_type"] == "stop"


def test_a_loop_free_stream_is_never_stopped():
    rng = random.Random(5)
    plans = {f"free{i}": plain_ids(rng, 1500) + [STOP] for i in range(6)}
    server = FakeSGLang(plans)
    results = run(server, [request(row, 4000) for row in plans])
    assert not server.aborts
    assert {k[0]: r["output_ids"] for k, r in results.items()} == plans


@pytest.mark.parametrize(
    "fault, status, reason",
    [
        ("http400", "failed", "HTTP 400: bad input"),
        ("error", "failed", "stream error 400: boom"),
        ("cut", "failed", ""),
    ],
)
def test_stream_errors_are_the_errors_of_an_answer(fault, status, reason):
    plans = plans_for()
    results = run(FakeSGLang(plans, faults={"plain": fault}), [request("plain", 4000)])
    r = results[("plain", 0, 0, "default")]
    assert r["status"] == status and "output_ids" not in r
    assert reason in r["error"]
    if fault == "cut":
        assert r["attempts"] == 2 and "cut short" in r["error"]  # retried, then given up
    else:
        assert r["attempts"] == 1  # final


def test_an_abort_the_client_did_not_ask_for_is_retried():
    answer = StreamedAnswer(request("plain", 4000), VOCAB, LIVE)
    answer.chunk(orjson.dumps({"text": "a", "output_ids": [101], "meta_info": {}}))
    abort = {"output_ids": [101], "meta_info": {"finish_reason": {"type": "abort", "message": "x"}}}
    with pytest.raises(Exception, match="aborted by the server"):
        answer.chunk(orjson.dumps({**abort, "meta_info": {**abort["meta_info"], "completion_tokens": 1}}))


def test_events_are_read_whole_however_the_bytes_are_cut():
    events = [b"data: " + orjson.dumps({"output_ids": [i] * i}) for i in range(1, 40)] + [b"data: [DONE]"]
    wire = b"".join(e + b"\n\n" for e in events)
    for cut in (1, 2, 7, 100, len(wire)):
        buf, start, got = bytearray(), 0, []
        for i in range(0, len(wire), cut):
            buf += wire[i : i + cut]
            found, consumed = _events(buf, start)
            del buf[:consumed]
            start = max(0, len(buf) - 1)
            got += found
        assert got == [e[6:] for e in events]


def test_a_server_that_streams_whole_outputs_turns_the_live_stop_off(caplog):
    infos = {
        "http://a": {"server_info": {"incremental_streaming_output": True}},
        "http://b": {"server_info": {"incremental_streaming_output": False}},
    }
    with caplog.at_level(logging.WARNING):
        assert _live_stop(LIVE, infos, "cat") is None
    assert "http://b" in caplog.text and "--incremental-streaming-output" in caplog.text
    assert "loops are not stopped live" in caplog.text and "not resumed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _live_stop(LiveStop(loop=None, stream_interval=8), infos, "cat") is None
    assert "not resumed" in caplog.text and "loops" not in caplog.text
    assert _live_stop(LIVE, {"http://a": infos["http://a"]}, "cat") == LIVE
    assert not streams_incrementally({}) and streams_incrementally({"incremental_streaming_output": True})


def test_launch_commands_ask_for_incremental_streaming_as_told():
    engine = defaults("engine", kind="sglang", sglang={"model_path": "m"}, local={"backend": "scripted"})
    for live in (True, False):
        sglang = sglang_command(engine, port=1, context_length=8, incremental_streaming=live)
        local = local_engine_command(
            {**engine, "kind": "local"}, port=1, context_length=8, tokenizer="t", incremental_streaming=live
        )
        assert (INCREMENTAL_STREAMING_FLAG in sglang) == live == (INCREMENTAL_STREAMING_FLAG in local)


def test_answers_are_streamed_whatever_the_quality_config_and_watched_for_loops_as_it_says():
    assert LiveStop.from_quality(QualitySettings.from_config()).loop == QualitySettings.from_config().loop
    off = LiveStop.from_quality(QualitySettings.from_config({"live_stop": False, "stream_interval": 5}))
    assert off == LiveStop(loop=None, stream_interval=5)
    keep = QualitySettings.from_config({"policies": {"repetition_loop": "keep"}})
    assert LiveStop.from_quality(keep).loop is None


def test_without_the_live_stop_a_cut_stream_is_resumed_and_no_loop_is_stopped():
    plans = plans_for()
    server = FakeSGLang(plans, faults={"long": "cut_once", "loop": "cut_once"}, watched=False)
    results = run(server, [request("long", 2000), request("loop", 4000)], live=LiveStop(loop=None, stream_interval=8))
    assert not server.aborts
    for row in ("long", "loop"):
        r = results[(row, 0, 0, "default")]
        assert r["status"] == "ok" and r["attempts"] == 2 and r["finish_type"] == "length"
        assert r["output_ids"] == plans[row] and r["completion_tokens"] == len(plans[row])
        # Cut once after half of its answer, at a chunk's end: the continuation's prompt held the ids before.
        (at,) = r["resumed_at"]
        assert len(plans[row]) // 2 - 8 < at <= len(plans[row]) // 2
        assert {tuple(b["input_ids"]) for b in server.bodies if b["rid"].startswith(row + ".")} == {
            tuple(PROMPT),
            tuple(PROMPT + plans[row][:at]),
        }


def test_a_journalled_loop_row_is_reused_only_while_its_loop_would_be_stopped_again(tmp_path):
    plans = plans_for()
    journal = Journal(tmp_path / "j.jsonl")
    ids = plans["loop"][:420]
    journal.append({"id": "loop", "sample_index": 0, "fingerprint": "f", "status": "ok", "finish_type": LOOP_FINISH,
                    "output_ids": ids})  # fmt: skip
    journal.append({"id": "long", "sample_index": 0, "fingerprint": "g", "status": "ok", "finish_type": "length",
                    "output_ids": plans["long"]})  # fmt: skip
    for live_loop, reused in [(LOOP, True), (None, False), (LoopSettings(min_tokens=400, max_period=4), False)]:
        journal.reuse = loop_rows(live_loop)
        assert (journal.reusable("f") is not None) == reused
        assert journal.reusable("g") is not None  # a row not stopped as a loop is always reused
    journal.close()


def test_the_generate_step_stops_loops_live_and_resends_only_what_new_settings_would_not_stop(
    make_prompts, qwen3_tokenizer_dir, tmp_path
):
    """Through the generate step and the stand-in engine (incremental streaming, half the rows made to
    loop): looping rows end as `loop` with the ids the engine generated up to the abort, loop-free
    ones as the engine answered them; a rerun reuses the loop rows while the settings stop them, and
    sends them again when the live stop is off."""
    from conftest import conversations
    from eagle3_datagen.engine.loops import LoopInjection
    from eagle3_datagen.engine.scripted import ScriptedBackend
    from eagle3_datagen.steps.generate import generate
    from eagle3_datagen.storage.tables import read_provenance, read_rows
    from engine_thread import running_engine

    prompts, model = make_prompts(conversations(8), max_new_tokens=240)
    quality = {"loop": {"min_tokens": 16, "min_repeats": 4, "max_period": 8}, "stream_interval": 4}
    record = tmp_path / "record.jsonl"
    injected = LoopInjection(share=0.5, onset=(20, 60), period=(2, 6))
    with running_engine(
        # Paced (2 ms a token), so that an abort finds the request still running.
        ScriptedBackend(str(qwen3_tokenizer_dir), token_delay_s=0.002),
        record=record,
        incremental_streaming_output=True,
        loops=injected,
    ) as url:

        def run(q, name):
            out = tmp_path / f"{name}.parquet"
            generate(
                prompts=prompts,
                shard_generations=out,
                server_log=tmp_path / "server.log",
                category="cat",
                shard=0,
                model=model,
                sampling={"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
                engine=defaults("engine", kind="external", external={"urls": [url]}),
                budget={"max_new_tokens": 240, "min_new_tokens": 4, "reserve_tokens": 2},
                client={"concurrency": 4, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02},
                max_failed_share=0.0,
                cache_dir=str(tmp_path / "cache"),
                shards=1,
                quality=q,
            )
            return {r["id"]: r for r in read_rows(out)}, read_provenance(out)

        rows, provenance = run(quality, "first")
        served = [orjson.loads(line) for line in record.read_text().splitlines()]
        by_row = {e["rid"].rsplit(".", 3)[0]: e for e in served if e["status"] == 200}
        looping = {row for row, e in by_row.items() if e.get("loop")}
        assert looping and len(looping) < len(rows)
        for row_id, r in rows.items():
            assert r["status"] == "ok" and r["output_ids"] == by_row[row_id]["output_ids"]
            assert (r["finish_type"] == LOOP_FINISH) == (row_id in looping)
            if row_id in looping:
                assert len(r["output_ids"]) < 240
        assert provenance["live_stop"]["stopped_live"] is True is provenance["live_stop"]["streamed"]
        assert provenance["live_stop"]["loop"] == quality["loop"]

        rows_again, provenance = run(quality, "again")  # every row reused
        assert provenance["plan"]["to_send"] == 0 and rows_again == rows
        rows_off, provenance = run({**quality, "live_stop": False}, "off")  # the loop rows sent again, whole
        assert provenance["plan"]["to_send"] == len(looping)
        assert provenance["live_stop"]["stopped_live"] is False and provenance["live_stop"]["streamed"] is True
        assert all(rows_off[row]["finish_type"] == "length" for row in looping)
        assert all(
            rows_off[row]["output_ids"][: len(rows[row]["output_ids"])] == rows[row]["output_ids"] for row in looping
        )
