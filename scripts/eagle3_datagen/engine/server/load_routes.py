"""The load endpoints: `GET /v1/loads` (0.5.23's, or 0.5.8's when acting as a version before 0.5.23)
and `GET /get_load` (before 0.5.23 only: 0.5.23 has no such route, FastAPI's 404). Their bodies are
`loads`' pure functions of one snapshot per DP rank (`load_snapshots`).

With a backend that carries a `capacity` scheduler the snapshot is the scheduler's; otherwise it
counts the requests in flight.

Imports `protocol`, `loads`, `backends.jobs` and `server.http_io`, `.state`.
"""

import logging
import time
from typing import Any

from aiohttp import web

from eagle3_datagen.engine import loads
from eagle3_datagen.engine.backends.jobs import RUNNING, WAITING
from eagle3_datagen.engine.protocol.errors import bad_request_body, http_exception_body
from eagle3_datagen.engine.protocol.validation import validation_message
from eagle3_datagen.engine.server.http_io import json_response
from eagle3_datagen.engine.server.state import ENGINE_KEY, EngineServer

log = logging.getLogger(__name__)


def load_snapshots(srv: EngineServer) -> list[dict[str, Any]]:
    """One load snapshot per DP rank (one rank): the scheduler's last, or the requests in flight.

    Without the capacity model the pool is taken as `max_running_requests` rows of the full
    context, and a request counts as running once the backend has started it."""
    if srv.scheduler is not None:
        return [dict(srv.backend.load_snapshot, timestamp=time.time())]
    running, waiting = [], []
    for job in list(srv.inflight.values()):
        if job.state == RUNNING:
            running.append((len(job.input_ids), len(job.output_ids)))
        elif job.state == WAITING:
            waiting.append(len(job.input_ids))
    return [
        loads.inflight_snapshot(
            running=running,
            waiting_tokens=waiting,
            max_running_requests=srv.backend.max_batch,
            max_total_tokens=srv.backend.max_batch * srv.context_length,
            timestamp=time.time(),
        )
    ]


async def v1_loads(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    query = request.rel_url.query
    raw_rank = query.get("dp_rank")
    include = query.get("include")
    dp_rank = None
    if raw_rank is not None:
        try:
            dp_rank = int(raw_rank)
        except ValueError:
            # FastAPI's query validation, answered by http_server's RequestValidationError handler.
            err = [{"type": "int_parsing", "loc": ("query", "dp_rank"),
                    "msg": "Input should be a valid integer, unable to parse string as an integer",
                    "input": raw_rank}]  # fmt: skip
            return json_response(bad_request_body(validation_message(err, "GET", "/v1/loads")), 400)
    if srv.legacy:
        try:
            body = loads.legacy_v1_loads(load_snapshots(srv), include=include, dp_rank=dp_rank, version=srv.version)
        except ValueError as e:
            return json_response(http_exception_body(str(e), 400), 400)
        return json_response(body)
    snapshots = loads.select_rank(load_snapshots(srv), dp_rank)
    try:
        if query.get("format") == "prometheus":
            text = loads.v1_loads_prometheus(snapshots, include=include)
            return web.Response(
                body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
            )
        return json_response(loads.v1_loads(snapshots, include=include, version=srv.version))
    except ValueError as e:
        # Raised by LoadSnapshot.to_dict outside v1_loads.get_loads' try: FastAPI's bare 500.
        log.error("/v1/loads failed: %s", e)
        return web.Response(text="Internal Server Error", status=500)


async def get_load(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    if not srv.legacy:
        return json_response({"detail": "Not Found"}, 404)  # 0.5.23 has no /get_load: FastAPI's 404
    log.warning(
        "Endpoint '/get_load' is deprecated and will be removed in a future version. Please use '/v1/loads' instead."
    )
    return json_response(loads.get_load(load_snapshots(srv)))
