"""Reading requests and writing answers over aiohttp, as the routes share them.

Imports `protocol.validation`.
"""

from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from eagle3_datagen.engine.protocol import validation

DISCONNECT_POLL_S = 0.2  # how often a waiting route looks for a client that went away


# SGLang 0.5.23 writes every JSON answer with orjson (utils/json_response.py `dumps_json`: compact,
# UTF-8, non-string keys allowed), as `application/json` without a charset parameter.
ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps_json(data: Any) -> bytes:
    return orjson.dumps(data, option=ORJSON_OPTIONS)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps_json(data), status=status, content_type="application/json")


async def read_checked(request: web.Request, errors: Callable[[Any], list[dict[str, Any]]]) -> Any:
    """The JSON body of a request, read and checked as FastAPI reads and checks SGLang's: refused
    (RequestError) when it is empty, not sent as JSON, not JSON, or `errors` (the route's model
    check, `protocol.validation`) finds something wrong with it."""
    body = validation.decode_body(await request.read(), request.headers.get("Content-Type"), request.path)
    found = errors(body)
    if found:
        raise validation.validation_error(found, request.method, request.path)
    return body


def disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
