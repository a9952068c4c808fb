"""The routes besides `/generate` and the load endpoints: `/health` (and `/health_generate`),
`/server_info`, `/model_info`, `/abort_request` and `/flush_cache`, answered as SGLang 0.5.23's
http_server.py answers them.

Imports `protocol` and `server.http_io`, `.state`.
"""

import logging
from typing import Any

from aiohttp import web

from eagle3_datagen.engine.protocol.errors import RequestError
from eagle3_datagen.engine.protocol.responses import DEFAULT_WEIGHT_VERSION
from eagle3_datagen.engine.protocol.validation import abort_errors, lax_bool
from eagle3_datagen.engine.server.http_io import json_response, read_checked
from eagle3_datagen.engine.server.state import ENGINE_KEY, EngineServer

log = logging.getLogger(__name__)


async def health(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    return web.Response(status=200 if srv.ready and not srv.never_healthy else 503)


def server_info_dict(srv: EngineServer) -> dict[str, Any]:
    """`/server_info` less the address it was asked at (`host`, `port` None)."""
    return {
        "model_path": srv.model_path,
        "tokenizer_path": srv.tokenizer_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "load_format": "auto",
        "trust_remote_code": bool(getattr(srv.backend, "trust_remote_code", False)),
        "context_length": srv.context_length,
        # scheduler_info (tp_worker.py): min(context, KV pool) - 1 - 5; this engine's pool is unbounded.
        "max_req_input_len": srv.scheduler.max_req_input_len if srv.scheduler else srv.context_length - 6,
        "is_embedding": False,
        "served_model_name": srv.model_path,
        "weight_version": DEFAULT_WEIGHT_VERSION,
        "host": None,
        "port": None,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        # The flags as given (server_args): --max-running-requests only with the capacity model.
        "max_running_requests": srv.scheduler.max_running_requests if srv.scheduler else None,
        "max_total_tokens": srv.scheduler.max_total_tokens if srv.scheduler else None,
        "reasoning_parser": None,
        "tool_call_parser": None,
        "allow_auto_truncate": False,
        "preferred_sampling_params": None,
        "sampling_defaults": "model",
        "random_seed": None,
        "enable_deterministic_inference": bool(srv.backend.deterministic),
        "enable_metrics": srv.enable_metrics,
        "stream_interval": srv.stream_interval,
        "incremental_streaming_output": srv.incremental_streaming_output,
        "startup_time": startup_time(srv),
        "internal_states": [],
        "version": srv.version,
        "frontend": "python",
        "engine": "local",
        "backend": srv.backend.name,
    }


CUDA_GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")


def startup_time(srv: EngineServer) -> dict[str, Any]:
    """0.5.23's `startup_time`: seconds per start-up phase (scheduler's `load_weight`,
    `kv_cache_allocation`, `scheduler_e2e`, `cuda_graph` per phase; the tokenizer manager's
    `tokenizer_e2e`). Here the backend's start is the weights and the scheduler; no KV pool is
    allocated and no graph captured."""
    load = srv.load_s or 0.0
    return {
        "load_weight": load,
        "kv_cache_allocation": 0.0,
        "scheduler_e2e": load,
        "cuda_graph": dict.fromkeys(CUDA_GRAPH_PHASES, 0.0),
        "tokenizer_e2e": load,
    }


async def server_info(request: web.Request) -> web.Response:
    info = server_info_dict(request.app[ENGINE_KEY])
    host, port = request.url.host, request.url.port
    info["host"], info["port"] = host, port
    return json_response(info)


async def model_info(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    return json_response(
        {
            "model_path": srv.model_path,
            "served_model_name": srv.model_path,
            "tokenizer_path": srv.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": DEFAULT_WEIGHT_VERSION,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": srv.backend.model_type,
            "architectures": srv.backend.architectures,
        }
    )


async def abort_request(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    try:
        body = await read_checked(request, abort_errors)
    except RequestError as e:
        return json_response(e.body, e.status)
    rid = body.get("rid") or ""
    abort_all = lax_bool(body.get("abort_all"))
    if abort_all:
        targets = list(srv.inflight.values())
    elif rid and rid in srv.inflight:
        # scheduler.abort_request matches by prefix once the rid is known.
        targets = [j for r, j in srv.inflight.items() if r.startswith(rid)]
    else:
        targets = []
    for job in targets:
        job.request_abort()
    log.info("abort_request rid=%r abort_all=%s: %d aborted", rid, abort_all, len(targets))
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    if srv.inflight:
        return web.Response(text="Flush cache failed.\n", status=400)
    if srv.scheduler is not None:
        srv.backend.request_flush_cache()
    return web.Response(
        text=(
            "Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be "
            "performed.)\n"
        ),
        status=200,
    )
