"""The local engine's web app (`create_app`): an `EngineServer` and the routes wired to it.

Imports `settings`, `backends.jobs`, `backends.loops` and `server.faults`, `.http_io`, `.state`, `.generate`, `.info`, `.load_routes`.
"""

import logging
from pathlib import Path

from aiohttp import web

from eagle3_datagen.engine.backends.jobs import Backend
from eagle3_datagen.engine.backends.loops import LoopInjection
from eagle3_datagen.engine.server import generate, info, load_routes
from eagle3_datagen.engine.server.faults import Faults
from eagle3_datagen.engine.server.http_io import json_response
from eagle3_datagen.engine.server.state import ENGINE_KEY, EngineServer
from eagle3_datagen.settings import SGLANG_VERSION

log = logging.getLogger(__name__)


def _deprecated(old: str, new: str, handler):
    """0.5.23's `get_` routes: the same answer, and a warning in the server log (http_server.py)."""

    async def route(request: web.Request) -> web.Response:
        log.warning(
            "Endpoint '%s' is deprecated and will be removed in a future version. Please use '%s' instead.", old, new
        )
        return await handler(request)

    return route


@web.middleware
async def starlette_errors(request: web.Request, handler) -> web.StreamResponse:
    """Starlette's JSON answers for a path no route serves and a method the path does not take."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return json_response({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed as e:
        resp = json_response({"detail": "Method Not Allowed"}, 405)
        resp.headers["Allow"] = ", ".join(sorted(e.allowed_methods))
        return resp


def create_app(
    backend: Backend,
    *,
    context_length: int,
    model_path: str,
    tokenizer_path: str,
    record_path: Path | None = None,
    version: str = SGLANG_VERSION,
    faults: Faults | None = None,
    enable_metrics: bool = False,
    incremental_streaming_output: bool = False,
    stream_interval: int = 1,
    loops: LoopInjection | None = None,
) -> web.Application:
    """The local engine's web app. The backend starts (loads) in the background at app start;
    `/health` answers 503 until it is ready."""
    srv = EngineServer(
        backend,
        context_length=context_length,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        record_path=record_path,
        version=version,
        faults=faults,
        enable_metrics=enable_metrics,
        incremental_streaming_output=incremental_streaming_output,
        stream_interval=stream_interval,
        loops=loops,
    )
    app = web.Application(client_max_size=1 << 30, middlewares=[starlette_errors])
    app[ENGINE_KEY] = srv
    app.on_startup.append(srv.on_startup)
    app.on_cleanup.append(srv.on_cleanup)
    app.router.add_post("/generate", generate.generate)
    app.router.add_put("/generate", generate.generate)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, info.health)
    app.router.add_get("/server_info", info.server_info)
    app.router.add_get("/model_info", info.model_info)
    app.router.add_get("/get_server_info", _deprecated("/get_server_info", "/server_info", info.server_info))
    app.router.add_get("/get_model_info", _deprecated("/get_model_info", "/model_info", info.model_info))
    app.router.add_post("/abort_request", info.abort_request)
    app.router.add_get("/flush_cache", info.flush_cache)
    app.router.add_post("/flush_cache", info.flush_cache)
    app.router.add_get("/v1/loads", load_routes.v1_loads)
    app.router.add_get("/get_load", load_routes.get_load)
    return app
