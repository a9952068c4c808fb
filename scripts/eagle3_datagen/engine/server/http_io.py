"""Reading requests and writing answers over aiohttp, as the routes share them.

Imports nothing of the engine.
"""

import json
from typing import Any

import orjson
from aiohttp import web

DISCONNECT_POLL_S = 0.2  # how often a waiting route looks for a client that went away


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, ensure_ascii=False), status=status, content_type="application/json")


async def read_json(request: web.Request) -> Any:
    """`request.json()`, parsed by orjson where the body is UTF-8; anything orjson refuses is parsed
    again by `json.loads`, so that results and errors stay exactly those of `request.json()`."""
    raw = await request.read()
    charset = request.charset
    if charset is None or charset.lower() in ("utf-8", "utf8"):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw.decode(charset or "utf-8"))


def disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
