"""Resume against the real SGLang 0.5.23 server on CPU (the real-SGLang tier): a stream dropped mid-answer
goes on from the ids received, and the row is the answer an uncut request gets.

The server runs the demo model with `--incremental-streaming-output`, greedy. The same requests go
through the project's `GenerateClient` twice, streamed with the live stop: straight to the server (the
reference), then through a proxy that drops each request's first stream once it has passed on a chosen
number of ids (a different fraction of each answer), as a timeout or a lost connection does. The
client sends the prompt and the ids received, for the budget left; SGLang answers only the new ids
(the ids sent as input are not echoed: tokenizer_manager.py answers `output_ids` of the new tokens,
and `meta_info.prompt_tokens` counts the ids received). Every row must equal the reference and
transformers' greedy continuation of the original prompt (`greedy_exact`), its `resumed_at` naming
where the continuation began; the cut requests leave nothing running on the server.
"""

import json
import urllib.request

import aiohttp
import orjson
import pytest
from aiohttp import web
from test_real_sglang_live_stop import GREEDY, LOOPS, single_turn_prompts

from eagle3_datagen.generation.client import GenerateClient, run_loop
from eagle3_datagen.generation.load import parse_loads
from eagle3_datagen.generation.requests import RequestTemplate, parse_rid
from eagle3_datagen.generation.streaming import LiveStop
from eagle3_datagen.settings import ClientSettings
from polling import wait_until
from real_sglang import greedy_exact, real_server

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

BUDGET = 160
ROWS = 8
JSON = {"Content-Type": "application/json"}  # SGLang reads a body only as JSON


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


async def through_cutting_proxy(upstream: str, cut_at: dict, run) -> dict:
    """`await run(proxy_url)` with a proxy in front of `upstream` that drops the stream of a row's
    first attempt once it has passed on `cut_at[row]` ids or more (at an event's end); what it cut:
    {row: ids passed on}."""
    cut: dict = {}

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        sent = parse_rid(orjson.loads(body)["rid"])
        limit = cut_at.get(sent.row[0]) if sent.attempt == 1 else None
        async with (
            aiohttp.ClientSession(headers=JSON) as session,
            session.post(f"{upstream}/generate", data=body) as up,
        ):
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await resp.prepare(request)
            passed, buf = 0, b""
            async for data in up.content.iter_any():
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    await resp.write(event + b"\n\n")
                    if event.startswith(b"data: {"):
                        passed += len(orjson.loads(event[6:]).get("output_ids") or ())
                    if limit is not None and passed >= limit:
                        cut[sent.row[0]] = passed
                        request.transport.abort()  # the upstream request closes with this handler
                        return resp
            await resp.write_eof()
            return resp

    async def abort(request: web.Request) -> web.Response:
        async with aiohttp.ClientSession(headers=JSON) as session:
            async with session.post(f"{upstream}/abort_request", data=await request.read()) as up:
                return web.Response(status=up.status, body=await up.read())

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        await run(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
    finally:
        await runner.cleanup()
    return cut


def test_a_stream_cut_mid_answer_is_resumed_into_the_greedy_answer(tmp_path, demo_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    requests = [r for r in single_turn_prompts(tokenizer)][:ROWS]
    for r in requests:
        r.max_new_tokens = BUDGET
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    template = RequestTemplate(GREEDY, [im_end], len(tokenizer))
    settings = ClientSettings.from_config(concurrency=4, request_timeout_floor_s=3600, backoff_initial_s=0.1)
    live = LiveStop(loop=LOOPS, stream_interval=4)
    log = tmp_path / "real_sglang.log"
    with real_server(demo_model_dir, log, extra=["--incremental-streaming-output"]) as url:
        whole = run_loop(GenerateClient([url], template, settings, live=live).run(requests))
        # Each row's first stream dropped at a different share of its answer: from its first chunk on.
        cut_at = {
            key[0]: max(1, len(r["output_ids"]) * (i + 1) // (ROWS + 2))
            for i, (key, r) in enumerate(sorted(whole.items()))
            if len(r["output_ids"]) > 8
        }
        results = {}

        async def run(proxy: str) -> None:
            results.update(await GenerateClient([proxy], template, settings, live=live).run(requests))

        cut = run_loop(through_cutting_proxy(url, cut_at, run))
        wait_until(
            lambda: (load := parse_loads(get_json(f"{url}/v1/loads"))).running == 0 and load.waiting == 0,
            f"the server to run and hold no request after the cut run (log: {log})",
            timeout_s=120,
            interval_s=0.2,
        )

    failed = {k: r["error"] for run_ in (whole, results) for k, r in run_.items() if r["status"] != "ok"}
    assert not failed, failed
    resumed = {key[0]: r["resumed_at"] for key, r in results.items() if "resumed_at" in r}
    cut = {row: n for row, n in cut.items() if n < len(whole[(row, 0, 0, "default")]["output_ids"])}
    assert len(cut) >= 3, (cut, cut_at)
    # A stream cut before its last chunk is resumed where its ids stopped coming.
    assert resumed == {row: [n] for row, n in cut.items()}
    for key, row in results.items():
        assert row["output_ids"] == whole[key]["output_ids"], f"{key[0]}: the resumed answer differs"
        assert row["finish_type"] == whole[key]["finish_type"], key[0]
        assert row["completion_tokens"] == len(row["output_ids"]), key[0]
    by_key = {r.key: r for r in requests}
    rows = [
        {**r, "id": key[0], "turn": 0, "tools": "", "prompt_ids": by_key[key].prompt_ids, "max_new_tokens": BUDGET}
        for key, r in results.items()
    ]
    checked = greedy_exact(rows, demo_model_dir, stop_ids=(im_end,))
    assert sum(checked.values()) == len(requests)
