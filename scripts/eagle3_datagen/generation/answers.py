"""What came back for one request: SGLang's /generate answer checked and turned into result fields,
or an error classed as retryable (5xx, 429, timeouts, aborted or malformed answers) or final (400).
Imports `requests` only; no network code.
"""

import json

import orjson

from eagle3_datagen.generation.requests import Request

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class FinalError(Exception):
    """A request error that retrying cannot fix (HTTP 400 and the like)."""


class RetryableError(Exception):
    """A transient request error: the row is sent again after a backoff."""


def error_text(status: int, body: str) -> str:
    """SGLang's error shapes as one line: {"error": {"message"}}, {"error": "..."}, {"detail": ...}, and
    the OpenAI-style {"object": "error", "message", ...} of 0.5.23's validation errors and aborts."""
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status}: {body[:500]}"
    message = data
    if isinstance(data, dict):
        message = next((data[key] for key in ("error", "detail", "message") if key in data), data)
        if isinstance(data.get("error"), dict):
            message = message.get("message", message)
    return f"HTTP {status}: {message}"


# The answer's output ids as SGLang serializes them (orjson: no spaces). Inside a JSON string every
# quote is escaped, so this key can only be the top-level one, never a piece of `text`.
_IDS_KEY = b'"output_ids":['
_PLAIN_IDS = b"0123456789,"


def ids_are_plain(raw: bytes | None, n: int) -> bool | None:
    """Whether `output_ids` are written as digits and commas only, read from the answer's bytes in one pass
    of C code; None when `raw` does not hold them in SGLang's compact form (then each id is checked)."""
    start = raw.find(_IDS_KEY) if raw is not None else -1
    end = raw.find(b"]", start) if start >= 0 else -1  # the key holds no "]"
    if end < 0:
        return None
    region = raw[start + len(_IDS_KEY) : end]
    if region.count(b",") != max(n - 1, 0):
        return None  # not the list orjson parsed (a nested or repeated key): check one by one
    return not region.translate(None, _PLAIN_IDS)


def check_ids(output_ids, vocab_size: int, raw: bytes | None = None, *, whole: bool = True) -> None:
    """RetryableError unless `output_ids` is a list of non-negative integers (`whole`: each below `vocab_size`)."""
    if not isinstance(output_ids, list):
        raise RetryableError("malformed response: 'output_ids' missing or not a list of integers")
    plain = ids_are_plain(raw, len(output_ids))
    if plain is None:  # not SGLang's compact bytes: one check per id
        plain = set(map(type, output_ids)) <= {int} and (not output_ids or min(output_ids) >= 0)
    if not plain:
        if not all(type(t) is int for t in output_ids):
            raise RetryableError("malformed response: 'output_ids' missing or not a list of integers")
        bad = [t for t in output_ids if t < 0]
        raise RetryableError(f"malformed response: output ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
    if whole and output_ids and max(output_ids) >= vocab_size:
        bad = [t for t in output_ids if not 0 <= t < vocab_size]
        raise RetryableError(f"malformed response: output ids outside the vocabulary (size {vocab_size}): {bad[:5]}")


def parse_response(data, req: Request, vocab_size: int, raw: bytes | None = None) -> dict:
    """Validate one /generate answer and turn it into result fields; a bad answer is retryable."""
    if not isinstance(data, dict):
        raise RetryableError(f"malformed response: expected an object, got {type(data).__name__}")
    output_ids = data.get("output_ids")
    meta = data.get("meta_info")
    check_ids(output_ids, vocab_size, raw, whole=False)
    if not isinstance(meta, dict) or not isinstance(meta.get("finish_reason"), dict):
        raise RetryableError("malformed response: 'meta_info.finish_reason' missing")
    finish = meta["finish_reason"]
    finish_type = finish.get("type")
    if finish_type == "abort":
        raise RetryableError(f"aborted by the server: {finish.get('message')}")
    if finish_type not in ("stop", "length"):
        raise RetryableError(f"malformed response: unknown finish_reason type {finish_type!r}")
    if not output_ids:
        raise RetryableError("malformed response: no output tokens")
    if len(output_ids) > req.max_new_tokens:
        raise RetryableError(
            f"malformed response: {len(output_ids)} output tokens, more than max_new_tokens {req.max_new_tokens}"
        )
    if max(output_ids) >= vocab_size:
        bad = [t for t in output_ids if not 0 <= t < vocab_size]
        raise RetryableError(f"malformed response: output ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
    matched = finish.get("matched")
    return {
        "output_ids": output_ids,
        "finish_type": finish_type,
        "finish_matched": "" if matched is None else str(matched),
        "completion_tokens": int(meta.get("completion_tokens", len(output_ids))),
        "cached_tokens": int(meta.get("cached_tokens", 0) or 0),
        "e2e_latency": float(meta.get("e2e_latency", 0.0) or 0.0),
        # Load facts (SGLang 0.5.23 tokenizer_manager._handle_batch_output): how often the scheduler
        # retracted the request to free KV cache, and (with --enable-metrics) its seconds queued.
        "num_retractions": int(meta.get("num_retractions", 0) or 0),
        "queue_time": float(meta.get("queue_time", 0.0) or 0.0),
    }


def interpret(status: int, raw: bytes, req: Request, vocab_size: int) -> dict:
    """One answer's (status, body bytes) as result fields; RetryableError or FinalError otherwise."""
    if status != 200:
        message = error_text(status, raw.decode("utf-8", errors="replace"))
        raise (RetryableError if status in RETRYABLE_STATUS else FinalError)(message)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RetryableError(f"malformed response: invalid JSON: {raw[:200]!r}") from None
    return parse_response(data, req, vocab_size, raw)
