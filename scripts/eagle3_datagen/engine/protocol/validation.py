"""FastAPI's refusals of a request before SGLang 0.5.23's route runs: the body read as FastAPI reads
it, then checked against the route's pydantic model, as 400 `ErrorResponse` bodies.

- `fastapi/routing.py` `get_request_handler`: an empty body is missing; a body is parsed as JSON
  only under a JSON `Content-Type` (`application/json`, `application/*+json`; none at all counts as
  not JSON, FastAPI's `strict_content_type`), else it stays bytes; SGLang's `ORJSONRequest` parses
  it with orjson, whose error text and position a refusal names (`decode_body`).
- pydantic's errors for the fields of `io_struct.GenerateReqInput` that a client of `/generate`
  sends (`text`, `input_ids` with its `field_validators.validate_optional_list_i64_1d_2d`,
  `sampling_params`, `stream`, `rid`; `generate_errors`) and of `AbortReq` (`rid`, `abort_all`;
  `abort_errors`). Other fields of those models are not checked here.
- `http_server.validation_exception_handler`: the message is `str(RequestValidationError)`, which
  ends with the endpoint's source file and line, then the errors again (`validation_message`). The
  file is named from the package down (`sglang/srt/...`): the real one prints where it is installed.

Imports `protocol.errors` only.
"""

import email.message
from array import array
from typing import Any

import orjson

from eagle3_datagen.engine.protocol.errors import RequestError, bad_request_body

# The endpoint functions of 0.5.23 a validation error names: (file, line, function).
ENDPOINTS = {
    "/generate": ("sglang/srt/entrypoints/http_server.py", 928, "generate_request"),
    "/abort_request": ("sglang/srt/entrypoints/http_server.py", 1721, "abort_request"),
    "/v1/loads": ("sglang/srt/entrypoints/v1_loads.py", 96, "get_loads"),
}
# pydantic's lax booleans: these strings (any case), 0 and 1.
TRUE_STRINGS = {"1", "on", "t", "true", "y", "yes"}
FALSE_STRINGS = {"0", "off", "f", "false", "n", "no"}
MISSING = object()


def validation_message(errors: list[dict[str, Any]], method: str, path: str) -> str:
    """`http_server.validation_exception_handler`'s message: `str(exc)`, a space, `str(exc.errors())`."""
    file, line, function = ENDPOINTS[path]
    n = len(errors)
    text = f"{n} validation error{'s' if n != 1 else ''}:\n" + "".join(f"  {e}\n" for e in errors)
    text += f'\n  File "{file}", line {line}, in {function}\n    {method} {path}'
    return f"{text.rstrip()} {errors}"


def validation_error(errors: list[dict[str, Any]], method: str, path: str) -> RequestError:
    return RequestError(bad_request_body(validation_message(errors, method, path)), 400)


def is_json_content_type(content_type: str | None) -> bool:
    """Whether FastAPI parses a body with this `Content-Type` header as JSON."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def decode_body(raw: bytes, content_type: str | None, path: str) -> Any:
    """The body as the route's model sees it: MISSING (empty), bytes (not JSON by its header), or
    parsed JSON; a body that does not parse is refused (RequestError) as FastAPI refuses it."""
    if not raw:
        return MISSING
    if not is_json_content_type(content_type):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        error = {"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error", "input": {},
                 "ctx": {"error": e.msg}}  # fmt: skip
        raise validation_error([error], "POST", path) from None


def _missing() -> list[dict[str, Any]]:
    return [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]


def _string_type(loc: tuple, value: Any) -> dict[str, Any]:
    return {"type": "string_type", "loc": loc, "msg": "Input should be a valid string", "input": value}


def _str_or_list(name: str, value: Any) -> list[dict[str, Any]]:
    """`Optional[Union[str, List[str]]]`: the errors of both members when neither accepts `value`."""
    if value is None or isinstance(value, str):
        return []
    loc = ("body", name)
    if isinstance(value, list):
        elements = [_string_type((*loc, "list[str]", i), e) for i, e in enumerate(value) if not isinstance(e, str)]
        if not elements:
            return []
        return [_string_type((*loc, "str"), value), *elements]
    list_error = {"type": "list_type", "loc": (*loc, "list[str]"), "msg": "Input should be a valid list",
                  "input": value}  # fmt: skip
    return [_string_type((*loc, "str"), value), list_error]


def _lax_bool(loc: tuple, value: Any, *, optional: bool) -> list[dict[str, Any]]:
    """A pydantic `bool` in lax mode: booleans, 0 and 1, and a few strings pass."""
    if isinstance(value, bool) or (value is None and optional):
        return []
    if isinstance(value, str):
        ok = value.lower() in TRUE_STRINGS | FALSE_STRINGS
    elif isinstance(value, (int, float)):
        ok = value in (0, 1)
    else:
        return [{"type": "bool_type", "loc": loc, "msg": "Input should be a valid boolean", "input": value}]
    if ok:
        return []
    return [{"type": "bool_parsing", "loc": loc, "msg": "Input should be a valid boolean, unable to interpret input",
             "input": value}]  # fmt: skip


def lax_bool(value: Any) -> bool:
    """The boolean pydantic makes of a value `_lax_bool` let through ("false", 0 and null are false)."""
    return value.lower() in TRUE_STRINGS if isinstance(value, str) else bool(value)


def _i64_list(v: Any) -> None:
    """`field_validators.validate_list_i64_1d`."""
    if v is None:
        raise ValueError("must not be None")
    if not isinstance(v, list):
        raise ValueError(f"must be list; got {type(v).__name__}")
    if not v:
        return
    if not isinstance(v[0], int):
        raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
    try:
        array("q", v)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"contains non-int64 element: {e}") from None


def _input_ids_error(v: Any) -> str | None:
    """`field_validators.validate_optional_list_i64_1d_2d`'s ValueError text, or None."""
    try:
        if v is None:
            return None
        if not isinstance(v, list):
            raise ValueError(f"must be list or null; got {type(v).__name__}")
        if not v:
            return None
        if isinstance(v[0], int):
            _i64_list(v)
        elif isinstance(v[0], list):
            for i, row in enumerate(v):
                try:
                    _i64_list(row)
                except ValueError as e:
                    raise ValueError(f"row {i}: {e}") from None
        else:
            raise ValueError(f"elements must be int or list; got {type(v[0]).__name__}")
    except ValueError as e:
        return str(e)
    return None


def _sampling_params(value: Any) -> list[dict[str, Any]]:
    """`Optional[Union[List[Dict[str, Any]], Dict[str, Any]]]`."""
    if value is None or isinstance(value, dict):
        return []
    loc = ("body", "sampling_params")
    as_list = "list[dict[str,any]]"
    if isinstance(value, list):
        errors = [{"type": "dict_type", "loc": (*loc, as_list, i), "msg": "Input should be a valid dictionary",
                   "input": e} for i, e in enumerate(value) if not isinstance(e, dict)]  # fmt: skip
        if not errors:
            return []
    else:
        errors = [{"type": "list_type", "loc": (*loc, as_list), "msg": "Input should be a valid list", "input": value}]
    errors.append({"type": "dict_type", "loc": (*loc, "dict[str,any]"), "msg": "Input should be a valid dictionary",
                   "input": value})  # fmt: skip
    return errors


def generate_errors(body: Any) -> list[dict[str, Any]]:
    """pydantic's errors for a `/generate` body against `GenerateReqInput`, in its field order
    (the keyword-only `rid` last)."""
    if body is MISSING:
        return _missing()
    if not isinstance(body, dict):
        return [{"type": "dataclass_type", "loc": ("body",),
                 "msg": "Input should be a dictionary or an instance of GenerateReqInput", "input": body,
                 "ctx": {"class_name": "GenerateReqInput"}}]  # fmt: skip
    errors = _str_or_list("text", body.get("text"))
    text = _input_ids_error(body.get("input_ids"))
    if text is not None:
        errors.append({"type": "value_error", "loc": ("body", "input_ids"), "msg": f"Value error, {text}",
                       "input": body["input_ids"], "ctx": {"error": ValueError(text)}})  # fmt: skip
    errors += _sampling_params(body.get("sampling_params"))
    if "stream" in body:
        errors += _lax_bool(("body", "stream"), body["stream"], optional=False)
    return errors + _str_or_list("rid", body.get("rid"))


def abort_errors(body: Any) -> list[dict[str, Any]]:
    """pydantic's errors for an `/abort_request` body against the msgspec struct `AbortReq`."""
    if body is MISSING:
        return _missing()
    instance = {"type": "is_instance_of", "loc": ("body", "is-instance[AbortReq]"),
                "msg": "Input should be an instance of AbortReq", "input": body, "ctx": {"class": "AbortReq"}}  # fmt: skip
    struct = ("body", "function-after[build_struct(), AbortReq]")
    if not isinstance(body, dict):
        return [
            instance,
            {"type": "dict_type", "loc": struct, "msg": "Input should be a valid dictionary", "input": body},
        ]
    errors = []
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        errors.append(_string_type((*struct, "rid"), rid))
    if "abort_all" in body:
        errors += _lax_bool((*struct, "abort_all"), body["abort_all"], optional=False)
    return [instance, *errors] if errors else []
