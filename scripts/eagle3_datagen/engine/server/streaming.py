"""A streamed `/generate` answer (`stream_answer`): server-sent events written as the backend's
tokens come, as SGLang 0.5.23 streams them (see `protocol.streaming` for the chunks).

The worker tells a watched job's `wake` event when SGLang's scheduler would send a chunk
(`Job.progressed`: the first token, then every `stream_interval` tokens) and when the job ends;
every wake-up writes what is new since the last chunk, so that chunks queued meanwhile are
coalesced as the tokenizer manager coalesces them. A client that goes away aborts the jobs; they
are recorded with status 499 once the backend has stopped them.

Imports `protocol`, `backends.jobs` and `server.http_io`, `.state`.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from eagle3_datagen.engine.backends.jobs import DONE, Job
from eagle3_datagen.engine.protocol.parsing import ParsedGenerate
from eagle3_datagen.engine.protocol.streaming import SSE_CONTENT_TYPE, SSE_DONE, StreamText, partial_meta, sse
from eagle3_datagen.engine.server.http_io import DISCONNECT_POLL_S, disconnected, dumps_json
from eagle3_datagen.engine.server.state import EngineServer

log = logging.getLogger(__name__)

# (job, t_start, t_end) -> the job's whole answer as a non-streamed request gets it
Respond = Callable[[Job, float, float], dict[str, Any]]


class ClientGone(Exception):
    """The client of a stream went away."""


class JobStream:
    """One job's chunks: what was sent so far, and the next chunk once there is something new."""

    def __init__(self, srv: EngineServer, job: Job, *, incremental: bool):
        self.job = job
        self.incremental = incremental
        self.offset = 0  # output ids sent so far
        self.first = True  # no chunk sent yet: the next one carries response_sent_to_client_ts
        self.done = False
        self.text = StreamText(srv.backend.tokenizer, job.params)

    def next_chunk(self, respond: Respond, t_start: float) -> dict[str, Any] | None:
        job = self.job
        if job.state == DONE:
            self.done = True
            return self._final(respond, t_start)
        n = job.sent
        if n <= self.offset:
            return None
        ids = job.output_ids
        delta = self.text.advance(ids, n)
        stats = job.stats or {}
        meta = partial_meta(
            job.rid,
            prompt_tokens=len(job.input_ids),
            completion_tokens=n,
            cached_tokens=stats.get("cached_tokens", 0),
            num_retractions=stats.get("num_retractions", 0),
        )
        out_ids = ids[self.offset : n] if self.incremental else ids[:n]
        text = delta if self.incremental else self.text.text
        self.offset = n
        return self._stamp({"text": text, "output_ids": out_ids, "meta_info": meta})

    def _final(self, respond: Respond, t_start: float) -> dict[str, Any]:
        job = self.job
        out = respond(job, t_start, time.time())
        ids = list(job.output_ids)
        delta = self.text.finish(ids, job.finish_reason, out["text"])
        if self.incremental:
            out["meta_info"]["completion_tokens"] = len(ids)
            if "prompt_tokens" not in out["meta_info"]:  # _handle_abort_req: a request aborted before it ran
                out["output_ids"] = ids[-1:]
            else:
                out["output_ids"], out["text"] = ids[self.offset :], delta
        self.offset = len(ids)
        if not self.first:
            out["meta_info"].pop("response_sent_to_client_ts", None)
        return self._stamp(out)

    def _stamp(self, out: dict[str, Any]) -> dict[str, Any]:
        if self.first:
            self.first = False
            out["meta_info"].setdefault("response_sent_to_client_ts", time.time())
        return out


async def stream_answer(
    srv: EngineServer,
    request: web.Request,
    parsed: ParsedGenerate,
    jobs: list[Job],
    futures: list[asyncio.Future],
    wake: asyncio.Event,
    respond: Respond,
    t_start: float,
) -> web.StreamResponse:
    """Stream the jobs' chunks (each with its `index` in a batch) until all have ended, then `[DONE]`."""
    resp = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
    await resp.prepare(request)
    streams = [JobStream(srv, job, incremental=srv.incremental_streaming_output) for job in jobs]
    try:
        while not all(s.done for s in streams):
            try:
                await asyncio.wait_for(wake.wait(), DISCONNECT_POLL_S)
            except TimeoutError:
                if disconnected(request):
                    raise ClientGone() from None
                continue
            wake.clear()
            for i, s in enumerate(streams):
                chunk = None if s.done else s.next_chunk(respond, t_start)
                if chunk is None:
                    continue
                if not parsed.is_single:
                    chunk["index"] = i
                await resp.write(sse(dumps_json(chunk)))
                if s.done:
                    srv.record_job(s.job, 200, t_start)
        await resp.write(SSE_DONE)
        await resp.write_eof()
    except (ClientGone, ConnectionError) as e:
        log.info("stream client went away (%s); aborting %s", type(e).__name__, [j.rid for j in jobs])
        for job in jobs:
            job.request_abort()
        await asyncio.wait(futures, timeout=5.0)
        for s in streams:
            if not s.done:
                srv.record_job(s.job, 499, t_start)
    return resp
