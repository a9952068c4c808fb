"""The generate client against the local engine (scripted backend): exact ids, retries, final errors."""

import asyncio
import json
import logging
import random
import re
import time
from collections import Counter

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from eagle3_datagen.engine.app import create_app
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.engine.server import Faults
from eagle3_datagen.generation.answers import FinalError, RetryableError, error_text, ids_are_plain, parse_response
from eagle3_datagen.generation.client import GenerateClient
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.pacing import Deadlines, Progress, retry_kind
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.server_info import check_server_info
from eagle3_datagen.settings import ClientSettings

FAST = dict(backoff_initial_s=0.01, backoff_max_s=0.05, progress_interval_s=0.5)


@pytest.fixture
def backend(qwen3_tokenizer_dir):
    # One per test: the app closes its backend when it shuts down.
    return ScriptedBackend(str(qwen3_tokenizer_dir))


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer):
    return qwen3_tokenizer


def requests_for(tokenizer, n, *, max_new_tokens=40):
    out = []
    for i in range(n):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        out.append(
            Request(
                id=f"q.{i}",
                sample_index=0,
                prompt_ids=ids,
                max_new_tokens=max_new_tokens,
                seed=1000 + i,
                fingerprint=f"f{i}",
            )
        )
    return out


def template(tokenizer):
    return RequestTemplate(
        sampling={"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
        stop_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")],
        vocab_size=len(tokenizer),
    )


def run_against(
    backend,
    tokenizer,
    requests,
    *,
    faults=None,
    record=None,
    settings=None,
    context_length=4096,
    journal=None,
    clients=None,
    limit_s=None,
):
    """The client's results for `requests` against an engine app of `backend`; `clients`, a list,
    gets the client; `limit_s`: a run that takes longer fails (TimeoutError) instead of hanging."""

    async def main():
        app = create_app(
            backend,
            context_length=context_length,
            model_path="m",
            tokenizer_path="t",
            record_path=record,
            faults=faults,
        )
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            client = GenerateClient(
                [url],
                template(tokenizer),
                settings or ClientSettings.from_config(concurrency=8, **FAST),
                rng=random.Random(0),
            )
            if clients is not None:
                clients.append(client)
            async with aiohttp.ClientSession() as session:
                for _ in range(400):
                    async with session.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            break
                    await asyncio.sleep(0.05)
            return await asyncio.wait_for(client.run(requests, journal), limit_s)

    return asyncio.run(main())


def read_record(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ok_rows_hold_exactly_the_served_output_ids(backend, tokenizer, tmp_path):
    reqs = requests_for(tokenizer, 20)
    results = run_against(backend, tokenizer, reqs, record=tmp_path / "rec.jsonl")
    served = {r["rid"].rsplit(".", 2)[0]: r for r in read_record(tmp_path / "rec.jsonl")}
    assert len(served) == 20
    for req in reqs:
        result = results[req.key]
        assert result["status"] == "ok" and result["attempts"] == 1
        engine = served[f"{req.id}.{req.sample_index}"]
        assert result["output_ids"] == engine["output_ids"]
        assert engine["input_ids"] == req.prompt_ids
        assert engine["sampling_params"]["sampling_seed"] == req.seed
        assert engine["sampling_params"]["max_new_tokens"] == req.max_new_tokens


def test_transient_faults_are_retried_until_every_row_is_ok(backend, tokenizer, tmp_path, caplog):
    reqs = requests_for(tokenizer, 40)
    faults = Faults(error_rate=0.2, reset_rate=0.1, seed=3)
    with caplog.at_level(logging.INFO, logger="eagle3_datagen.generation.client"):
        results = run_against(
            backend,
            tokenizer,
            reqs,
            faults=faults,
            record=tmp_path / "rec.jsonl",
            settings=ClientSettings.from_config(concurrency=8, max_retries=10, **FAST),
        )
    assert all(r["status"] == "ok" for r in results.values())
    retries = sum(r["attempts"] - 1 for r in results.values())
    assert retries > 0  # some were retried
    # Why, at INFO: the first few retries of each kind with their row and attempt, then counts by kind.
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "; retrying in" in r.message]
    kinds = Counter(retry_kind(line.split(": ", 2)[2]) for line in said)
    assert set(kinds) <= {"HTTP 500", "HTTP 503", "connection error"} and set(kinds)
    assert all(n <= Progress.RETRIES_LOGGED for n in kinds.values()) and len(said) < retries
    assert all(re.search(r": q\.\d+\.0 attempt \d+: ", line) for line in said)
    last = [r.getMessage() for r in caplog.records if "rows (" in r.getMessage()][-1]
    counts = dict((kind, int(n)) for n, kind in re.findall(r"(\d+) (HTTP \d+|connection error)", last))
    assert f"{retries} retries: " in last and sum(counts.values()) == retries and set(counts) >= set(kinds)
    rids = [r["rid"] for r in read_record(tmp_path / "rec.jsonl")]
    assert len(rids) == len(set(rids))  # a fresh rid per attempt


def test_retries_are_said_at_info_a_few_of_each_kind_then_counted(caplog):
    progress = Progress(total=10, interval_s=60, label="cat")
    with caplog.at_level(logging.INFO, logger="eagle3_datagen.generation.client"):
        for attempt in range(1, 11):
            progress.retried(f"row{attempt}", attempt, f"timed out after {attempt} s", 0.5)
        progress.retried("row", 1, "no chunk for 61 s", 0.5)
        progress.log()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines[:4] == [
        "cat: row1 attempt 1: timed out after 1 s; retrying in 0.5 s",
        "cat: row2 attempt 2: timed out after 2 s; retrying in 0.5 s",
        "cat: row3 attempt 3: timed out after 3 s; retrying in 0.5 s "
        "(further retries of this kind are counted on the progress line)",
        "cat: row attempt 1: no chunk for 61 s; retrying in 0.5 s",
    ]
    assert len(lines) == 5 and "(0 failed, 11 retries: 10 timed out, 1 no chunk)" in lines[4]


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_retry_gets_a_slot_when_every_request_is_out(backend, tokenizer, concurrency):
    """Once the last request has gone out, the dispatcher waits for follow-ups without holding a
    slot: a retry of a request in flight (here every failed attempt) takes one, even at
    concurrency 1 (which auto concurrency may also come down to)."""
    reqs = requests_for(tokenizer, 3)
    settings = ClientSettings.from_config(concurrency=concurrency, max_retries=10, **FAST)
    results = run_against(
        backend, tokenizer, reqs, faults=Faults(error_rate=0.4, seed=3), settings=settings, limit_s=120
    )
    assert all(r["status"] == "ok" for r in results.values())
    assert sum(r["attempts"] for r in results.values()) > len(reqs)  # some were retried


def test_hangs_time_out_and_are_retried(backend, tokenizer):
    reqs = requests_for(tokenizer, 10)
    settings = ClientSettings.from_config(
        concurrency=4, max_retries=8, request_timeout_floor_s=0.5, request_timeout_per_token_s=0.0, **FAST
    )
    results = run_against(backend, tokenizer, reqs, faults=Faults(hang_rate=0.3, seed=1), settings=settings)
    assert all(r["status"] == "ok" for r in results.values())


def test_persistent_failures_are_recorded_with_their_reason(backend, tokenizer, tmp_path):
    reqs = requests_for(tokenizer, 6)
    settings = ClientSettings.from_config(concurrency=4, max_retries=2, **FAST)
    with Journal(tmp_path / "j.jsonl") as journal:
        results = run_against(
            backend, tokenizer, reqs, faults=Faults(fail_rids=r"^q\.[24]\."), settings=settings, journal=journal
        )
    failed = {k for k, r in results.items() if r["status"] == "failed"}
    assert failed == {("q.2", 0, 0, "default"), ("q.4", 0, 0, "default")}
    for key in failed:
        assert results[key]["attempts"] == 3
        assert "gave up after 3 attempts: HTTP 500" in results[key]["error"]
    with Journal(tmp_path / "j.jsonl") as journal:
        assert {k for k in journal._keys if journal.entry(k)["status"] == "failed"} == failed


def test_http_400_is_final_and_keeps_the_servers_message(backend, tokenizer):
    (req,) = requests_for(tokenizer, 1, max_new_tokens=5000)
    results = run_against(backend, tokenizer, [req], context_length=1024)
    result = results[req.key]
    assert result["status"] == "failed" and result["attempts"] == 1
    assert result["error"].startswith("HTTP 400: ") and "exceed the context length 1024" in result["error"]


@pytest.mark.parametrize(
    "body, expected",
    [
        ('{"error": {"message": "too long"}}', "HTTP 400: too long"),
        ('{"error": "unknown field `x`"}', "HTTP 400: unknown field `x`"),
        ('{"detail": "Service unavailable"}', "HTTP 400: Service unavailable"),
        ("<html>bad gateway</html>", "HTTP 400: <html>bad gateway</html>"),
        (
            '{"object": "error", "message": "JSON decode error: Expecting value", "type": "Bad Request", "param": null, "code": 400}',
            "HTTP 400: JSON decode error: Expecting value",
        ),
    ],
)
def test_error_text_reads_every_sglang_error_shape(body, expected):
    assert error_text(400, body) == expected


@pytest.mark.parametrize(
    "data, problem",
    [
        ({"text": "x", "meta_info": {"finish_reason": {"type": "stop", "matched": 2}}}, "'output_ids' missing"),
        ({"output_ids": [1, "2"], "meta_info": {"finish_reason": {"type": "stop"}}}, "'output_ids' missing"),
        ({"output_ids": [1, 2], "meta_info": {}}, "finish_reason' missing"),
        (
            {"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "abort", "message": "Aborted"}}},
            "aborted by the server",
        ),
        (
            {"output_ids": [1, 999], "meta_info": {"finish_reason": {"type": "stop", "matched": 999}}},
            "outside the vocabulary",
        ),
        (
            {"output_ids": [1] * 11, "meta_info": {"finish_reason": {"type": "length", "length": 11}}},
            "more than max_new_tokens",
        ),
        ([], "expected an object"),
    ],
)
def test_malformed_answers_are_never_data(data, problem):
    req = Request("r", 0, [1], max_new_tokens=10, seed=1)
    # Checked from the parsed answer alone, from its bytes as SGLang writes them, and from bytes in
    # another layout (spaces, as a proxy might write them), where the ids are checked one by one.
    for raw in (None, orjson.dumps(data), json.dumps(data, indent=1).encode()):
        with pytest.raises(RetryableError, match=problem):
            parse_response(data, req, vocab_size=100, raw=raw)


@pytest.mark.parametrize(
    "ids, problem",
    [
        ([1, 2.0], "not a list of integers"),
        ([1, True], "not a list of integers"),
        ([1, None], "not a list of integers"),
        ([1, [2]], "not a list of integers"),
        ([1, -3], "outside the vocabulary"),
        ([1, 1e3], "not a list of integers"),
    ],
)
def test_ids_that_are_not_token_ids_fail_from_the_bytes_and_from_the_values(ids, problem):
    data = {"text": 'a "output_ids":[1] b', "output_ids": ids, "meta_info": {"finish_reason": {"type": "stop"}}}
    req = Request("r", 0, [1], max_new_tokens=10, seed=1)
    for raw in (None, orjson.dumps(data), json.dumps(data).encode()):
        with pytest.raises(RetryableError, match=problem):
            parse_response(orjson.loads(orjson.dumps(data)) if raw is not None else data, req, 100, raw=raw)


def test_plain_ids_are_read_from_the_bytes_without_a_check_per_id():
    data = {
        "text": 'x "output_ids":[9,9] y',
        "output_ids": [0, 5, 99],
        "meta_info": {"finish_reason": {"type": "stop"}},
    }
    raw = orjson.dumps(data)
    assert ids_are_plain(raw, 3) is True
    assert ids_are_plain(json.dumps(data).encode(), 3) is None  # spaces: checked one by one
    assert ids_are_plain(raw, 4) is None  # not the list that was parsed
    result = parse_response(orjson.loads(raw), Request("r", 0, [1], max_new_tokens=10, seed=1), 100, raw=raw)
    assert result["output_ids"] == [0, 5, 99] and result["num_retractions"] == 0


def test_server_checks_refuse_auto_truncation_and_warn_on_parsers():
    with pytest.raises(RuntimeError, match="allow-auto-truncate"):
        check_server_info({"allow_auto_truncate": True, "context_length": 4096}, context_length=4096, url="u")
    with pytest.raises(RuntimeError, match="context of 2048"):
        check_server_info({"context_length": 2048}, context_length=4096, url="u")
    # Started without --context-length (null): the limit comes from max_req_input_len (context - 6).
    assert check_server_info({"context_length": None, "max_req_input_len": 4090}, context_length=4096, url="u") == []
    with pytest.raises(RuntimeError, match="context of 4095"):
        check_server_info({"context_length": None, "max_req_input_len": 4089}, context_length=4096, url="u")
    with pytest.raises(RuntimeError, match="context of 3006"):  # a KV pool smaller than the context
        check_server_info({"context_length": 8192, "max_req_input_len": 3000}, context_length=4096, url="u")
    with pytest.raises(RuntimeError, match="start it with --context-length"):
        check_server_info({"context_length": None}, context_length=4096, url="u")
    warnings = check_server_info(
        {"context_length": 8192, "reasoning_parser": "kimi_k2", "tool_call_parser": "kimi_k2"},
        context_length=4096,
        url="u",
    )
    assert len(warnings) == 2 and "--reasoning-parser kimi_k2" in warnings[0]


def test_final_error_class_is_not_retryable():
    assert not issubclass(FinalError, RetryableError)


def test_malformed_answers_end_as_failed_rows_with_their_reason(tokenizer):
    """A server answering garbage for some rows: those rows fail with the reason, the rest are ok."""
    from aiohttp import web

    good_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    answers = {
        "q.0": lambda: web.Response(text="{not json", content_type="application/json"),
        "q.1": lambda: web.json_response({"text": "hi", "meta_info": {"finish_reason": {"type": "stop"}}}),
        "q.2": lambda: web.json_response(
            {"output_ids": [len(tokenizer) + 7], "meta_info": {"finish_reason": {"type": "stop", "matched": 1}}}
        ),
        "q.3": lambda: web.json_response(
            {"output_ids": [5], "meta_info": {"finish_reason": {"type": "abort", "message": "Aborted"}}}
        ),
    }

    async def generate(request):
        body = await request.json()
        row = body["rid"].rsplit(".", 3)[0]
        if row in answers:
            return answers[row]()
        return web.json_response(
            {
                "text": "",
                "output_ids": good_ids,
                "meta_info": {
                    "id": body["rid"],
                    "finish_reason": {"type": "stop", "matched": good_ids[0]},
                    "completion_tokens": 1,
                },
            }
        )

    async def main():
        app = web.Application()
        app.router.add_post("/generate", generate)
        async with TestServer(app, host="127.0.0.1") as server:
            client = GenerateClient(
                [str(server.make_url("")).rstrip("/")],
                template(tokenizer),
                ClientSettings.from_config(concurrency=4, max_retries=1, **FAST),
            )
            return await client.run(requests_for(tokenizer, 6))

    results = asyncio.run(main())
    reasons = {k[0]: r.get("error", "") for k, r in results.items() if r["status"] == "failed"}
    assert set(reasons) == {"q.0", "q.1", "q.2", "q.3"}
    assert "invalid JSON" in reasons["q.0"]
    assert "'output_ids' missing" in reasons["q.1"]
    assert "outside the vocabulary" in reasons["q.2"]
    assert "aborted by the server" in reasons["q.3"]
    assert all("output_ids" not in results[(k, 0, 0, "default")] for k in reasons)  # never written as data
    assert results[("q.4", 0, 0, "default")]["status"] == results[("q.5", 0, 0, "default")]["status"] == "ok"


def test_server_info_prefers_the_new_routes_and_falls_back_to_get(backend, tokenizer):
    from aiohttp import web

    from eagle3_datagen.generation.server_info import fetch_info

    async def main():
        old = web.Application()  # a server from before 0.5.23: only the get_ routes
        old.router.add_get("/get_server_info", lambda request: web.json_response({"version": "0.5.8"}))
        async with TestServer(old, host="127.0.0.1") as server:
            assert await fetch_info(str(server.make_url("")).rstrip("/"), "server_info") == {"version": "0.5.8"}
        app = create_app(backend, context_length=4096, model_path="m", tokenizer_path="t")
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            info = await fetch_info(url, "server_info")
            assert info["context_length"] == 4096 and (await fetch_info(url, "model_info"))["model_path"] == "m"

    asyncio.run(main())


def test_auto_concurrency_follows_the_engines_load_endpoint(qwen3_tokenizer_dir, tokenizer):
    """Against the engine's capacity model (it runs at most 6 requests at once): the client reads
    /v1/loads, and its limit stays near what the server runs instead of climbing to the cap."""
    from eagle3_datagen.engine.capacity import KVScheduler, StepModel

    scheduler = KVScheduler(6, 200_000, step_model=StepModel(base_ms=0.5, per_request_ms=0.0))
    backend = ScriptedBackend(str(qwen3_tokenizer_dir), scheduler=scheduler)
    settings = ClientSettings.from_config(concurrency="auto", max_concurrency=64, load_poll_s=0.01, **FAST)
    clients = []
    results = run_against(backend, tokenizer, requests_for(tokenizer, 60), settings=settings, clients=clients)
    assert all(r["status"] == "ok" for r in results.values())
    client = clients[0]
    facts = client.load_facts()
    timeline = facts["timeline"]
    assert facts["concurrency"] == "auto" and facts["load_endpoint"] == ["/v1/loads"]
    assert timeline["t"] and all(r is not None and r <= 6 for r in timeline["running"])
    # Slow start doubles from 8 to 16 at most, then the limit follows the 6 running plus the queue.
    assert facts["limit_max"] <= 16 and client.control.limit <= 6 + 4
    assert all("num_retractions" in r and "queue_time" in r for r in results.values())


def test_the_load_is_read_from_get_load_where_v1_loads_is_missing_and_not_at_all_without_either(caplog):
    from aiohttp import web

    async def get_load(request):
        return web.json_response([{"dp_rank": 0, "num_reqs": 5, "num_waiting_reqs": 2, "num_tokens": 9, "ts_tic": 1.0}])

    async def main(routes):
        app = web.Application()
        app.add_routes(routes)
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            client = GenerateClient([url], RequestTemplate({}, [1], 10), ClientSettings.from_config())
            first = await client.loads.read(client.session)
            second = await client.loads.read(client.session)
            await client.close()
            return first, second, client.loads.paths[url]

    first, second, path = asyncio.run(main([web.get("/get_load", get_load)]))
    assert first == second and (first.running, first.waiting, path) == (3, 2, "/get_load")
    first, second, path = asyncio.run(main([]))
    assert first is None and second is None and path is None  # asked once, then never again


def test_the_request_fingerprint_is_the_canonical_hash_byte_for_byte():
    from eagle3_datagen.settings import stable_hash

    rng = random.Random(5)
    # min_p 1e-05: a float orjson writes otherwise (0.00001) than the canonical form, so that form is used.
    for n, min_p in ((0, 0.0), (1, 1e-05), (300, 0.05), (300, 1e-05), (5000, 0.0)):
        template = RequestTemplate(
            sampling={"temperature": 0.6, "top_p": 0.95, "min_p": min_p, "top_k": -1, "repetition_penalty": 1.0},
            stop_token_ids=[163586, 163585],
            vocab_size=163840,
            model_fingerprint={"name": "Kimi-K2.5 «ü»", "tokenizer_sha256": "ab" * 32, "server": {"kind": "x"}},
        )
        req = Request("id.1", 3, [rng.randrange(163840) for _ in range(n)], 4096, seed=2**40 + n)
        expected = stable_hash(
            [template.model_fingerprint, req.prompt_ids, template.sampling_params(req), req.sample_index]
        )
        assert template.fingerprint(req) == expected
        assert template.fingerprint(req) == expected  # the second time, with the check made


async def sent(client, timeout_s=120):
    """Until the client has a request in flight (polled: a loaded machine is slow, not wrong)."""
    for _ in range(int(timeout_s / 0.005)):
        if client.in_flight:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the request was never sent")


def test_a_timeout_is_a_retryable_error_but_a_stop_stays_a_stop():
    """The watchdog's cancellation of a request past its deadline becomes a timeout; a cancellation
    from elsewhere (the job stopping), even at the same moment, is not swallowed."""
    from aiohttp import web

    async def never(request):
        await asyncio.sleep(3600)

    async def main():
        app = web.Application()
        app.add_routes([web.post("/generate", never)])
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            settings = ClientSettings.from_config(request_timeout_floor_s=0.2, request_timeout_per_token_s=0.0)
            client = GenerateClient([url], RequestTemplate({}, [1], 10), settings)
            req = Request("r", 0, [1], max_new_tokens=4, seed=1)
            with pytest.raises(RetryableError, match="timed out after 0 s"):
                await client._post(req, 1)
            task = asyncio.ensure_future(client._post(req, 2))
            await sent(client)
            client._deadlines._expired[task] = "timed out after 0 s"  # the watchdog's cancellation ...
            task.cancel()
            task.cancel()  # ... and a stop at the same moment
            outcome = (await asyncio.gather(task, return_exceptions=True))[0]
            assert isinstance(outcome, asyncio.CancelledError)
            task = asyncio.ensure_future(client._post(req, 3))
            await sent(client)
            task.cancel()  # a stop before the deadline
            outcome = (await asyncio.gather(task, return_exceptions=True))[0]
            assert isinstance(outcome, asyncio.CancelledError)
            assert client.in_flight == 0 and not client._deadlines._deadlines
            await client.close()

    asyncio.run(main())


def test_a_stream_is_cut_past_its_timeout_only_once_no_chunk_came_for_the_floor_and_says_which():
    class Stream:
        seen = 0.0

    async def main():
        deadlines = Deadlines()
        silent, busy, plain = Stream(), Stream(), asyncio.create_task(asyncio.sleep(60))
        tasks = [asyncio.create_task(asyncio.sleep(60)) for _ in range(2)]
        deadlines.watch(tasks[0], 1.0, silent, 1.0)
        deadlines.watch(tasks[1], 1.0, busy, 1.0)
        deadlines.watch(plain, 1.0)
        started = time.monotonic()
        while not (tasks[0].done() and plain.done()) or time.monotonic() - started < 3.0:
            busy.seen = time.monotonic()  # a chunk every 10 ms, well past the timeout
            await asyncio.sleep(0.01)
        assert not tasks[1].done()
        await asyncio.gather(tasks[1], return_exceptions=True)  # the chunks stop
        assert time.monotonic() - busy.seen >= 1.0
        reasons = [deadlines.expired(t) for t in (*tasks, plain)]
        deadlines.close()
        return reasons

    silent, busy, plain = asyncio.run(main())
    assert silent == plain == "timed out after 1 s"
    assert re.fullmatch(r"no chunk for \d+ s", busy)  # 1 s, or later on a loaded machine


def test_retry_kinds_keep_an_error_status_and_drop_counts_and_details():
    assert retry_kind("HTTP 503: busy") == "HTTP 503" != retry_kind("HTTP 500: oops")
    assert retry_kind("stream error 503: overloaded") == "stream error 503" != retry_kind("stream error 500: x")
    assert retry_kind("timed out after 61 s") == retry_kind("timed out after 3600 s") == "timed out"
    assert retry_kind("no chunk for 61 s") == "no chunk"
    assert retry_kind("connection error: ServerDisconnectedError: x") == "connection error"


def test_a_job_stopped_during_a_journal_fsync_has_counted_every_journalled_row(backend, tokenizer, tmp_path):
    """A job stopped (scancel: SIGTERM) while the journal's fsync is awaited publishes as done every row
    its journal holds: a row is counted when it is journalled, not after the fsync."""
    import threading

    syncing, release = threading.Event(), threading.Event()

    def sync():  # the job is stopped during the first fsync
        syncing.set()
        release.wait(60)

    async def main(journal):
        app = create_app(backend, context_length=4096, model_path="m", tokenizer_path="t")
        async with TestServer(app, host="127.0.0.1") as server:
            settings = ClientSettings.from_config(concurrency=4, **FAST)
            client = GenerateClient([str(server.make_url("")).rstrip("/")], template(tokenizer), settings)
            run = asyncio.ensure_future(client.run(requests_for(tokenizer, 40), journal))
            while not syncing.is_set():
                assert not run.done()
                await asyncio.sleep(0.01)
            run.cancel()  # the run cancels its requests at once, then waits for the fsync's thread
            threading.Timer(1.0, release.set).start()
            with pytest.raises(asyncio.CancelledError):
                await run
            return client

    with Journal(tmp_path / "j.jsonl") as journal:
        journal.sync_due, journal.sync = (lambda: True), sync
        client = asyncio.run(main(journal))
    journalled = len((tmp_path / "j.jsonl").read_text().splitlines())
    assert journalled >= 1 and client.progress.done == journalled
