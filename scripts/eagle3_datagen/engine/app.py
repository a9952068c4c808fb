"""The web app (`create_app`) and its `/generate` route: a body checked, its request run on the
backend and answered when it has ended or, streamed, chunk by chunk as SGLang streams it.
Injected faults come first; a client that goes away aborts its request (recorded with status 499
once the backend has stopped it). Imports `protocol`, `jobs` and `server`.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from eagle3_datagen.engine import protocol, server
from eagle3_datagen.engine.jobs import DONE, Backend, Job
from eagle3_datagen.engine.protocol import GenerateItem, RequestError, build_response
from eagle3_datagen.engine.server import ENGINE_KEY, EngineServer, json_response, read_json

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often a waiting route looks for a client that went away
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}
SSE_DONE = b"data: [DONE]\n\n"


def sse(data: Any) -> bytes:
    return b"data: " + protocol.dumps(data) + b"\n\n"


def disconnected(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def generate(request: web.Request) -> web.StreamResponse:
    srv = request.app[ENGINE_KEY]
    t_start = time.time()
    body = await read_json(request)
    if isinstance(body, web.Response):
        srv.record_body(None, 400, t_start, error="not a JSON body")
        return body
    if not srv.ready:
        srv.record_body(body, 503, t_start, error="The server is not ready yet.")
        return json_response({"detail": "The server is not ready yet."}, 503)
    try:
        item = protocol.parse_generate_body(body)
        if item.rid in srv.inflight:
            raise RequestError(f"Duplicate request ID detected: {item.rid}")
        protocol.validate_item(item, context_len=srv.context_length, vocab_size=srv.backend.vocab_size)
    except RequestError as e:
        log.info("%d for rid=%s: %s", e.status, body.get("rid") if isinstance(body, dict) else None, e.message)
        srv.record_body(body, e.status, t_start, error=e.message)
        if isinstance(body, dict) and body.get("stream") is True:  # SGLang: one error chunk of a 200 stream
            error = {"message": e.message, "type": "invalid_request_error", "code": e.status, "retryable": False}
            return web.Response(body=sse({"error": error}) + SSE_DONE, headers=SSE_HEADERS)
        return json_response(e.body, e.status)
    wake = asyncio.Event() if item.stream else None
    job, fut = _make_job(srv, item, wake)
    try:
        refused = await _inject_fault(srv, request, body, job, t_start)
        if refused is not None:
            return refused
        srv.backend.submit(job)
        if wake is not None:
            return await _stream(srv, request, job, fut, wake, t_start)
        return await _answer(srv, request, job, fut, t_start)
    except asyncio.CancelledError:  # the client went away: abort, record once the backend has stopped
        job.request_abort()
        task = asyncio.ensure_future(_record_when_done(srv, job, fut, t_start))  # `on_cleanup` waits for it
        srv.background.add(task)
        task.add_done_callback(srv.background.discard)
        raise
    finally:
        if srv.inflight.get(job.rid) is job:
            del srv.inflight[job.rid]


def _resolve(fut: asyncio.Future, job: Job, wake: asyncio.Event | None) -> None:
    if not fut.done():
        fut.set_result(job)
    if wake is not None:
        wake.set()


def _make_job(srv: EngineServer, item: GenerateItem, wake: asyncio.Event | None) -> tuple[Job, asyncio.Future]:
    """The request's job, in flight from now on, and a future its end resolves (streamed, watched:
    `wake` is set whenever a chunk is due or the job ends)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    on_done = lambda job: loop.call_soon_threadsafe(_resolve, fut, job, wake)  # noqa: E731
    job = Job(item, max_new_tokens=srv.max_new_tokens(item), on_done=on_done)
    job.loop = srv.loops.plan(item.rid, item.input_ids)
    if wake is not None:
        interval = item.sampling_params.get("stream_interval") or srv.stream_interval
        job.watch(lambda: loop.call_soon_threadsafe(wake.set), interval)
    srv.inflight[item.rid] = job
    return job, fut


async def _inject_fault(srv: EngineServer, request, body, job: Job, t_start: float):
    """The answer of an injected fault (the job aborted, the body recorded), or None once any latency passed."""
    kind, status, delay = srv.faults.draw([job.rid])
    if kind is not None:
        job.request_abort()
    if kind in ("fail_rid", "error"):
        detail = f"Injected failure for rid {job.rid}" if kind == "fail_rid" else f"Injected HTTP {status}"
        srv.record_body(body, status, t_start, error=detail, fault=kind)
        return json_response({"detail": detail}, status)
    if kind == "reset":
        srv.record_body(body, None, t_start, fault="reset")
        if request.transport is not None:
            request.transport.abort()
        raise web.HTTPServiceUnavailable()  # never written: the connection is gone
    if kind == "hang":
        while not disconnected(request):
            await asyncio.sleep(POLL_S)
        srv.record_body(body, None, t_start, fault="hang")
        return web.Response(status=499)
    if delay > 0:
        await asyncio.sleep(delay)
    return None


async def _record_when_done(srv: EngineServer, job: Job, fut: asyncio.Future, t_start: float) -> None:
    """A job aborted because the client went away, recorded (499) once the backend has stopped it."""
    await asyncio.wait([fut], timeout=5.0)
    srv.record_job(job, 499, t_start)


def _response(srv: EngineServer, job: Job, t_start: float) -> dict[str, Any]:
    text = protocol.decode_output_text(srv.backend.tokenizer, job.output_ids, job.finish_reason, job.params)
    queue_time = job.stats.get("queue_time", 0.0) if srv.enable_metrics and job.started_running else None
    return build_response(rid=job.rid, text=text, output_ids=job.output_ids, finish_reason=job.finish_reason,
                          prompt_tokens=len(job.input_ids) if job.started_running else None,
                          num_retractions=job.stats.get("num_retractions", 0), e2e_latency=time.time() - t_start,
                          queue_time=queue_time)  # fmt: skip


async def _answer(srv: EngineServer, request, job: Job, fut: asyncio.Future, t_start: float):
    """Wait for the job, then answer; a request the server ended itself (an abort with a status) fails so."""
    while not fut.done():
        await asyncio.wait([fut], timeout=POLL_S)
        if not fut.done() and disconnected(request):
            log.info("client went away; aborting %s", job.rid)
            job.request_abort()
            await _record_when_done(srv, job, fut, t_start)
            return web.Response(status=499)
    out = _response(srv, job, t_start)
    status = job.finish_reason.get("status_code") or 0
    status = status if 400 <= status < 600 else 200
    srv.record_job(job, status, t_start)
    if status != 200:
        return json_response({"error": {"message": job.finish_reason.get("message")}}, status)
    return json_response(out)


class StreamText:
    """A streamed request's text: deltas decoded incrementally, held back while it ends in an incomplete character."""

    def __init__(self, tokenizer: Any, params):
        self.tokenizer, self.params = tokenizer, params
        self.text = ""  # every delta so far
        self._surr = self._read = 0

    def advance(self, output_ids: Sequence[int], n: int) -> str:
        if n <= self._read:
            return ""
        decode = lambda ids: protocol.decode_output_text(self.tokenizer, ids, None, self.params)  # noqa: E731
        surr_text, new_text = decode(output_ids[self._surr : self._read]), decode(output_ids[self._surr : n])
        if len(new_text) <= len(surr_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(surr_text) :]
        self._surr, self._read = self._read, n
        self.text += delta
        return delta


def _chunk(srv: EngineServer, job: Job, text: StreamText, offset: int, t_start: float, ended: bool):
    """The job's next chunk (None when nothing is new) and the output length it brings the stream to;
    `ended`: the job had ended when its state was read (before its ids are). Only the first chunk
    (`offset` 0) carries response_sent_to_client_ts."""
    incremental, ids = srv.incremental_streaming_output, job.output_ids
    if ended:
        out = _response(srv, job, t_start)
        if offset:
            del out["meta_info"]["response_sent_to_client_ts"]
        delta = out["text"][len(text.text) :]
        if incremental:
            out["meta_info"]["completion_tokens"] = len(ids)
            if "prompt_tokens" not in out["meta_info"]:  # aborted before it ran: the last id only
                out["output_ids"] = ids[-1:]
            else:
                out["output_ids"], out["text"] = ids[offset:], delta
        return out, len(ids)
    n = job.sent
    if n <= offset:
        return None, offset
    delta = text.advance(ids, n)
    meta = protocol.partial_meta(job.rid, prompt_tokens=len(job.input_ids), completion_tokens=n,
                        num_retractions=job.stats.get("num_retractions", 0))  # fmt: skip
    meta.update({} if offset else {"response_sent_to_client_ts": time.time()})
    chunk = {"text": delta if incremental else text.text, "output_ids": ids[offset:n] if incremental else ids[:n]}
    return {**chunk, "meta_info": meta}, n


async def _stream(srv: EngineServer, request, job: Job, fut: asyncio.Future, wake, t_start: float):
    """Write the job's chunks as they come, until it has ended, then `[DONE]`."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    text, offset, done = StreamText(srv.backend.tokenizer, job.params), 0, False
    cut = srv.faults.cut()
    try:
        while not done:
            if cut is not None and offset >= cut:
                log.info("dropping the stream of %s after %d ids (injected cut)", job.rid, offset)
                request.transport.abort()
                raise ConnectionResetError("injected cut")
            try:
                await asyncio.wait_for(wake.wait(), POLL_S)
            except TimeoutError:
                if disconnected(request):
                    raise ConnectionResetError("client went away") from None
                continue
            wake.clear()
            done = job.state == DONE
            chunk, offset = _chunk(srv, job, text, offset, t_start, done)
            if chunk is None:
                continue
            await resp.write(sse(chunk))
            if done:
                srv.record_job(job, 200, t_start)
        await resp.write(SSE_DONE)
        await resp.write_eof()
    except ConnectionError as e:
        log.info("stream client went away (%s); aborting %s", type(e).__name__, job.rid)
        job.request_abort()
        if not done:
            await _record_when_done(srv, job, fut, t_start)
    return resp


def create_app(backend: Backend, **options: Any) -> web.Application:
    """The web app serving `backend` (`options` go to `EngineServer`). The backend starts (loads) in
    the background at app start; `/health` answers 503 until it is ready."""
    srv = EngineServer(backend, **options)
    app = web.Application(client_max_size=1 << 30)
    app[ENGINE_KEY] = srv
    app.on_startup.append(srv.on_startup)
    app.on_cleanup.append(srv.on_cleanup)
    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_get("/health", server.health)
    app.router.add_get("/health_generate", server.health)
    app.router.add_get("/server_info", server.server_info)
    app.router.add_get("/model_info", server.model_info)
    app.router.add_post("/abort_request", server.abort_request)
    app.router.add_route("*", "/flush_cache", server.flush_cache)
    app.router.add_get("/v1/loads", server.v1_loads)
    return app
