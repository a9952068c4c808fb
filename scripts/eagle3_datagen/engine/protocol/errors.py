"""The shapes of SGLang 0.5.23's refusals: the exception a request is refused with, and its JSON bodies.

- `http_server._create_error_response`: a ValueError of the tokenizer manager, 400
  `{"error": {"message": ...}}` (`error_body`, `value_error`).
- `http_server.generate_request`: the request-schema check's refusal, 400 `{"error": "<text>"}`.
- `http_server`'s handler of a `fastapi.HTTPException` and of a JSON decode or query validation
  error: the OpenAI-style `ErrorResponse` of `entrypoints/openai/protocol.py`.

Imports nothing of the engine.
"""

import json
from typing import Any


class RequestError(Exception):
    """A request the server refuses: `status` and the JSON `body` to answer with."""

    def __init__(self, body: dict[str, Any], status: int = 400):
        super().__init__(json.dumps(body))
        self.body = body
        self.status = status

    @property
    def message(self) -> str:
        err = self.body.get("error", self.body.get("detail", self.body.get("message")))
        if isinstance(err, dict):
            return str(err.get("message"))
        return str(err)


def error_body(message: str) -> dict[str, Any]:
    """`http_server._create_error_response`: a ValueError from the tokenizer manager."""
    return {"error": {"message": message}}


def http_exception_body(message: str, status: int) -> dict[str, Any]:
    """`http_server`'s handler of a `fastapi.HTTPException` (a 5xx abort of `_handle_abort_finish_reason`):
    the OpenAI-style `ErrorResponse` of entrypoints/openai/protocol.py."""
    return {"object": "error", "message": message, "type": str(status), "param": None, "code": status}


def bad_request_body(message: str) -> dict[str, Any]:
    """`http_server`'s answer to a body that is not JSON, or to a query FastAPI cannot validate
    (its RequestValidationError handler): the same `ErrorResponse`, type "Bad Request", code 400."""
    return {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}


def contract_error_body(text: str) -> dict[str, Any]:
    """`http_server.generate_request`: the request-schema check's refusal."""
    return {"error": text}


def value_error(message: str) -> RequestError:
    return RequestError(error_body(message), 400)
