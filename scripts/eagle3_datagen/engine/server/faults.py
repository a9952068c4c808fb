"""Injected misbehaviour of `/generate` for tests: what to inject (`Faults`, every draw from one
seeded RNG) and how an injected fault is answered (`inject_fault`).

Imports `backends.jobs` and `server.http_io`.
"""

import asyncio
import dataclasses
import random
import re
from typing import Any

from aiohttp import web

from eagle3_datagen.engine.backends.jobs import Job
from eagle3_datagen.engine.server.http_io import DISCONNECT_POLL_S, disconnected, json_response


@dataclasses.dataclass
class Faults:
    """Injected misbehaviour of `/generate`, drawn per HTTP request from `random.Random(seed)`.

    latency_ms: (lo, hi) added before the request runs (it is already in flight then).
    error_rate: probability of an HTTP 500 or 503 (even odds) with a `{"detail": ...}` body.
    reset_rate: probability of closing the connection without an answer.
    hang_rate: probability of never answering until the client goes away.
    fail_rids: a regex; a body with a rid it matches (re.search) always gets HTTP 500.
    """

    latency_ms: tuple[float, float] | None = None
    error_rate: float = 0.0
    reset_rate: float = 0.0
    hang_rate: float = 0.0
    fail_rids: str | None = None
    seed: int = 0

    def __post_init__(self):
        total = self.error_rate + self.reset_rate + self.hang_rate
        if not 0.0 <= total <= 1.0:
            raise ValueError(f"fault rates must add up to at most 1, got {total}")
        self._rng = random.Random(self.seed)
        self._fail = re.compile(self.fail_rids) if self.fail_rids else None

    def draw(self, rids: list[str]) -> tuple[str | None, int | None, float]:
        """(fault kind or None, HTTP status for "error", latency in seconds) for one request."""
        if self._fail is not None:
            for rid in rids:
                if self._fail.search(rid):
                    return "fail_rid", 500, 0.0
        u = self._rng.random()
        kind, status = None, None
        if u < self.reset_rate:
            kind = "reset"
        elif u < self.reset_rate + self.hang_rate:
            kind = "hang"
        elif u < self.reset_rate + self.hang_rate + self.error_rate:
            kind, status = "error", self._rng.choice((500, 503))
        delay = 0.0
        if self.latency_ms:
            lo, hi = self.latency_ms
            delay = self._rng.uniform(lo, hi) / 1000.0
        return kind, status, delay


async def inject_fault(
    srv: Any,
    request: web.Request,
    body: Any,
    jobs: list[Job],
    t_start: float,
    drawn: tuple[str | None, int | None, float] | None = None,
) -> web.StreamResponse | None:
    """Answer a body as the fault drawn for it (`drawn`, else a fresh draw of `srv.faults`) asks, or
    None once its latency has passed and the request may run. `srv` is the `state.EngineServer`;
    the body's jobs are aborted and the body is recorded when a fault ends it."""
    kind, status, delay = drawn or srv.faults.draw([j.rid for j in jobs])
    if kind in ("fail_rid", "error"):
        detail = f"Injected failure for rid {jobs[0].rid}" if kind == "fail_rid" else f"Injected HTTP {status}"
        srv.record_body(body, status, t_start, error=detail, fault=kind)
        for job in jobs:
            job.request_abort()
        return json_response({"detail": detail}, status)
    if kind == "reset":
        for job in jobs:
            job.request_abort()
        srv.record_body(body, None, t_start, fault="reset")
        if request.transport is not None:
            request.transport.abort()
        raise web.HTTPServiceUnavailable()  # never written: the connection is gone
    if kind == "hang":
        while not disconnected(request):
            await asyncio.sleep(DISCONNECT_POLL_S)
        for job in jobs:
            job.request_abort()
        srv.record_body(body, None, t_start, fault="hang")
        return web.Response(status=499)
    if delay > 0:
        await asyncio.sleep(delay)
    return None
