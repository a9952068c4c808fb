"""The `/generate` route: parse and check a body, run its requests on the backend (or answer them
from canned answers at once), and answer as SGLang 0.5.23 does: at once when they have all ended,
or, streamed, chunk by chunk (`server.streaming`). With loop injection (`srv.loops`) each request
gets its `backends.loops.LoopPlan` or None.

Answers report the scheduler's `num_retractions` and `cached_tokens` when the backend carries a
`capacity` scheduler; `enable_metrics` adds what SGLang's `--enable-metrics` adds to `meta_info`
(`queue_time` and the time stamps of `protocol.responses.metrics_meta_info`).

Imports `protocol`, `backends.jobs` and `server.http_io`, `.faults`, `.state`, `.streaming`.
"""

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from eagle3_datagen.engine.backends.jobs import Job
from eagle3_datagen.engine.protocol.errors import (
    RequestError,
    error_body,
    http_exception_body,
    value_error,
)
from eagle3_datagen.engine.protocol.parsing import ParsedGenerate, parse_generate_body, validate_item
from eagle3_datagen.engine.protocol.responses import build_response, decode_output_text, metrics_meta_info
from eagle3_datagen.engine.protocol.streaming import SSE_CONTENT_TYPE, SSE_DONE, error_chunk, sse
from eagle3_datagen.engine.protocol.validation import generate_errors
from eagle3_datagen.engine.server.faults import inject_fault
from eagle3_datagen.engine.server.http_io import (
    DISCONNECT_POLL_S,
    disconnected,
    dumps_json,
    json_response,
    read_checked,
)
from eagle3_datagen.engine.server.state import ENGINE_KEY, EngineServer
from eagle3_datagen.engine.server.streaming import stream_answer

log = logging.getLogger(__name__)


async def generate(request: web.Request) -> web.StreamResponse:
    srv = request.app[ENGINE_KEY]
    t_start = time.time()
    try:
        body = await read_checked(request, generate_errors)
    except RequestError as e:
        srv.record_body(None, 400, t_start, error=e.message)
        return json_response(e.body, e.status)
    if not srv.ready:
        detail = "The server is not ready yet."
        srv.record_body(body, 503, t_start, error=detail)
        return json_response({"detail": detail}, 503)
    try:
        parsed = _parse(srv, body)
    except RequestError as e:
        log.info("400 for rid=%s: %s", body.get("rid") if isinstance(body, dict) else None,
                 e.message)  # fmt: skip
        srv.record_body(body, e.status, t_start, error=e.message)
        if isinstance(body, dict) and body.get("stream") is True and isinstance(e.body.get("error"), dict):
            return await _stream_refusal(request, e)
        return json_response(e.body, e.status)

    drawn = None
    plans = [srv.loops.plan(item.rid, item.input_ids) for item in parsed.items] if srv.loops.active else None
    if srv.backend.canned and not parsed.stream and srv.canned_direct and not any(plans or ()):
        drawn = srv.faults.draw([item.rid for item in parsed.items])
        if drawn[0] is None and drawn[2] <= 0:
            return _answer_canned(srv, parsed, t_start)

    wake = asyncio.Event() if parsed.stream else None
    jobs, futures = _make_jobs(srv, parsed, plans, wake)
    try:
        return await _serve(srv, request, body, parsed, jobs, futures, t_start, drawn, wake)
    except asyncio.CancelledError:
        # The client went away and aiohttp cancelled the handler: abort, and record once
        # the backend has stopped working on the jobs.
        for job in jobs:
            job.request_abort()
        srv.in_background(_record_when_done(srv, jobs, futures, 499, t_start))
        raise
    finally:
        for job in jobs:
            if srv.inflight.get(job.rid) is job:
                del srv.inflight[job.rid]


def _parse(srv: EngineServer, body: Any) -> ParsedGenerate:
    """The body's single requests, checked as SGLang checks them (raises RequestError)."""
    parsed = parse_generate_body(body, tokenize=srv.tokenize)
    for item in parsed.items:  # tokenizer_manager._init_req_state
        if item.rid in srv.inflight:
            raise value_error(f"Duplicate request ID detected: {item.rid}")
    for item in parsed.items:
        validate_item(item, context_len=srv.context_length, vocab_size=srv.backend.vocab_size)
    return parsed


async def _stream_refusal(request: web.Request, e: RequestError) -> web.StreamResponse:
    """A streamed request the tokenizer manager refuses: its error as one chunk of a 200 answer."""
    resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
    await resp.prepare(request)
    await resp.write(sse(dumps_json(error_chunk(e.message, e.status))) + SSE_DONE)
    await resp.write_eof()
    return resp


def _make_jobs(
    srv: EngineServer, parsed: ParsedGenerate, plans: list | None = None, wake: asyncio.Event | None = None
) -> tuple[list[Job], list[asyncio.Future]]:
    """One job per single request, in flight from now on, each with a future its end resolves (and,
    streamed, watched: `wake` is set whenever a chunk is due or a job ends)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future] = []
    jobs: list[Job] = []
    for i, item in enumerate(parsed.items):
        fut = loop.create_future()

        def resolve(job: Job, fut=fut) -> None:
            if not fut.done():
                fut.set_result(job)
            if wake is not None:
                wake.set()

        def on_done(job: Job, resolve=resolve) -> None:
            loop.call_soon_threadsafe(resolve, job)

        job = Job(item, max_new_tokens=srv.max_new_tokens(item), on_done=on_done)
        job.loop = plans[i] if plans else None
        if wake is not None:
            interval = item.sampling_params.get("stream_interval") or srv.stream_interval
            job.watch(lambda: loop.call_soon_threadsafe(wake.set), interval)
        if srv.backend.canned:
            job.canned = srv.backend.canned_answer(item, job.max_new_tokens, job.loop)
        jobs.append(job)
        futures.append(fut)
        srv.inflight[item.rid] = job
    return jobs, futures


def _answer_canned(srv: EngineServer, parsed: ParsedGenerate, t_start: float) -> web.Response:
    """Answer a body from canned answers at once: no job, no worker thread, no text decode; the bytes
    are the prepared answers with the per-request fields filled in."""
    answers = [(item, srv.backend.canned_answer(item, srv.max_new_tokens(item))) for item in parsed.items]
    e2e = time.time() - t_start
    sent = time.time()
    parts = [answer.render(item.rid, len(item.input_ids), e2e, sent) for item, answer in answers]
    if srv.recorder.path is not None or srv.die_after is not None:
        for item, answer in answers:
            srv.record_answer(item, answer.output_ids, answer.finish_reason, 200, t_start)
    else:
        srv.served += len(answers)
    body = parts[0] if parsed.is_single else b"[" + b",".join(parts) + b"]"
    return web.Response(body=body, content_type="application/json")


async def _record_when_done(srv: EngineServer, jobs, futures, status: int, t_start: float) -> None:
    await asyncio.wait(futures, timeout=5.0)
    for job in jobs:
        srv.record_job(job, status, t_start)


async def _serve(
    srv: EngineServer, request, body, parsed, jobs, futures, t_start, drawn=None, wake=None
) -> web.StreamResponse:
    """Run the body's jobs (after any injected fault) and answer once all have ended, or stream them."""
    refused = await inject_fault(srv, request, body, jobs, t_start, drawn)
    if refused is not None:
        return refused
    for job in jobs:
        srv.backend.submit(job)
    if wake is not None:
        return await stream_answer(
            srv, request, parsed, jobs, futures, wake, lambda job, t0, t1: _response(srv, job, t0, t1), t_start
        )

    pending = set(futures)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
        if pending and disconnected(request):
            log.info("client went away; aborting %s", [j.rid for j in jobs])
            for job in jobs:
                job.request_abort()
            await asyncio.wait(pending, timeout=5.0)
            for job in jobs:
                srv.record_job(job, 499, t_start)
            return web.Response(status=499)
    return await _answer(srv, request, parsed, jobs, t_start)


async def _answer(srv: EngineServer, request, parsed: ParsedGenerate, jobs: list[Job], t_start: float):
    """The answer of a non-streamed body whose jobs have all ended, recorded."""
    t_end = time.time()
    outs = [_response(srv, job, t_start, t_end) for job in jobs]
    # A request ended by the server itself (status_code 4xx/5xx) fails the whole body, as
    # tokenizer_manager._handle_abort_finish_reason raises for it.
    for job in jobs:
        code = (job.finish_reason or {}).get("status_code")
        if code is not None and 400 <= code < 600:
            msg = job.finish_reason.get("message")
            for j in jobs:
                srv.record_job(j, code, t_start)
            if code == 400:
                return json_response(error_body(msg), 400)
            return json_response(http_exception_body(msg, code), code)
    for job in jobs:
        srv.record_job(job, 200, t_start)
    return json_response(outs[0] if parsed.is_single else outs)


def _response(srv: EngineServer, job: Job, t_start: float, t_end: float) -> dict[str, Any]:
    """One ended job's answer (`build_response`), its text decoded unless the backend set it."""
    text = job.text
    if text is None:
        text = decode_output_text(srv.backend.tokenizer, job.output_ids, job.finish_reason, job.params)
    return build_response(
        rid=job.rid,
        text=text,
        output_ids=job.output_ids,
        finish_reason=job.finish_reason,
        prompt_tokens=len(job.input_ids) if job.started_running else None,
        e2e_latency=t_end - t_start,
        **_meta_extras(srv, job, t_start, t_end),
    )


def _meta_extras(srv: EngineServer, job: Job, t_start: float, t_end: float) -> dict[str, Any]:
    """`build_response` arguments from the scheduler's numbers and, with metrics on, the time stats."""
    stats = job.stats or {}
    extras: dict[str, Any] = {
        "num_retractions": stats.get("num_retractions", 0),
        "cached_tokens": stats.get("cached_tokens", 0),
    }
    if srv.enable_metrics and job.started_running:
        started = job.t_start or t_start
        sched, req = metrics_meta_info(
            received_ts=t_start,
            forward_entry_ts=stats.get("forward_entry_ts") or started,
            prefill_finished_ts=stats.get("prefill_finished_ts") or started,
            queue_time=stats.get("queue_time", max(0.0, started - job.t_submit)),
            finished_ts=t_end,
            completion_tokens=len(job.output_ids),
        )
        extras["scheduler_metrics"], extras["request_metrics"] = sched, req
    return extras
