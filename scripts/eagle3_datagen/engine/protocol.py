"""SGLang's native `/generate` wire format as the client uses it, as pure functions: a body read and
checked (`parse_generate_body`, `validate_item`), sampling parameters, stopping
rules (`check_finish`), the answer (`build_response`). A refusal is a `RequestError` (HTTP 400 in
SGLang's `{"error": {"message"}}` shape): its status is SGLang's, its message the engine's own.
Imports nothing of the engine.
"""

import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import orjson


class RequestError(Exception):
    """A request the server refuses: `status` and the JSON `body` to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status, self.body = message, status, {"error": {"message": message}}


# The type of each sampling parameter the engine takes (SGLang's, less stop strings and constrained
# decoding, which the client never sends); object: not checked.
_KINDS = {
    "max_new_tokens": int, "min_new_tokens": int, "top_k": int, "stream_interval": int, "sampling_seed": int,
    "temperature": float, "top_p": float, "min_p": float, "frequency_penalty": float, "presence_penalty": float,
    "repetition_penalty": float, "ignore_eos": bool, "skip_special_tokens": bool, "no_stop_trim": bool,
    "spaces_between_special_tokens": bool, "stop_token_ids": list, "logit_bias": dict, "n": object,
    "custom_params": object,
}  # fmt: skip
TOP_K_ALL = 1 << 30


def _kind_ok(value: Any, kind: Any) -> bool:
    if value is None or kind is object:
        return True
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return type(value) is int if kind is int else isinstance(value, kind)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters after SGLang's defaults and its greedy rule."""

    max_new_tokens: int | None = 128
    stop_token_ids: frozenset = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        """SGLang samples greedily when top_k is 1 (temperature < 1e-6 sets it)."""
        return self.top_k == 1

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None) -> "SamplingParams":
        """From the request's dict (null means the default); RequestError for an unknown key or a bad type."""
        raw = dict(raw or {})
        for key, value in raw.items():
            if key not in _KINDS or not _kind_ok(value, _KINDS[key]) or key == "n" and value not in (None, 1):
                raise RequestError(f"sampling parameter {key!r}: unknown, or a bad value {value!r}")
        d = {k: v for k, v in raw.items() if v is not None and k in cls.__dataclass_fields__}
        d["max_new_tokens"] = raw.get("max_new_tokens", 128)
        d["stop_token_ids"] = frozenset(int(t) for t in (raw.get("stop_token_ids") or ()) if t is not None)
        if 0 <= d.get("temperature", 1.0) < 1e-6:
            d["temperature"], d["top_k"] = 1.0, 1
        if d.get("top_k") == -1:
            d["top_k"] = TOP_K_ALL
        return cls(**{**d, "logit_bias": raw.get("logit_bias") or None})

    def verify(self, vocab_size: int) -> None:
        """SGLang's `SamplingParams.verify` bounds (RequestError)."""
        max_new = self.max_new_tokens
        for ok, name in (
            (math.isfinite(self.temperature) and self.temperature >= 0.0, "temperature"),
            (0.0 < self.top_p <= 1.0 and 0.0 <= self.min_p <= 1.0 and self.top_k >= 1, "top_p, min_p or top_k"),
            (-2 <= self.frequency_penalty <= 2 and -2 <= self.presence_penalty <= 2, "a penalty"),
            (0.0 < self.repetition_penalty <= 2.0, "repetition_penalty"),
            (max_new is None or 0 <= self.min_new_tokens <= max_new, "max_new_tokens or min_new_tokens"),
            (self.min_new_tokens >= 0 and all(0 <= int(t) < vocab_size for t in self.logit_bias or ()), "logit_bias"),
            (self.sampling_seed is None or -(2**63) <= self.sampling_seed < 2**63, "sampling_seed"),
        ):  # fmt: skip
            if not ok:
                raise RequestError(f"{name} out of range: {self}")


# -- finish reasons and stopping rules (schedule_batch.py `FINISH_*`, `Req.update_finish_state`)
def finish_matched_token(token_id: int) -> dict[str, Any]:
    return {"type": "stop", "matched": int(token_id)}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": int(length)}


def finish_abort(message: str | None = None, status_code: int | None = None, err_type: str | None = None):
    """A running request aborted by /abort_request or a disconnect (or, with a status, by the server)."""
    return {"type": "abort", "message": message or "Aborted", "status_code": status_code, "err_type": err_type}


def finish_abort_waiting() -> dict[str, Any]:
    """A request aborted before it ran."""
    return {"type": "abort", "message": "Abort in waiting queue"}


def stop_sets(eos_token_ids, params: SamplingParams) -> tuple[frozenset, frozenset]:
    """(the ids that end generation: the model's EOS set plus the request's own, none under ignore_eos;
    the ids masked until `min_new_tokens` tokens exist: that set whatever ignore_eos says)."""
    banned = frozenset(eos_token_ids) | params.stop_token_ids
    return frozenset() if params.ignore_eos else banned, banned


def check_finish(output_ids: Sequence[int], *, stop_ids: frozenset, max_new_tokens: int) -> dict[str, Any] | None:
    """The finish reason once the last token was appended, or None: a stop id, then the length."""
    if output_ids and output_ids[-1] in stop_ids:
        return finish_matched_token(output_ids[-1])
    return finish_length(max_new_tokens) if len(output_ids) >= max_new_tokens else None


def decode_output_text(tokenizer: Any, output_ids: Sequence[int], finish_reason, params: SamplingParams) -> str:
    """`text` as SGLang's detokenizer makes it: a matched stop id trimmed unless `no_stop_trim`."""
    ids = list(output_ids)
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, int) and not isinstance(matched, bool) and not params.no_stop_trim and ids:
        ids = ids[:-1]
    spaces = params.spaces_between_special_tokens
    return tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens, spaces_between_special_tokens=spaces)


# -- a /generate body (io_struct.GenerateReqInput, tokenizer_manager._validate_one_request)
@dataclasses.dataclass
class GenerateItem:
    """A `/generate` body's single request (`sampling_params` as received)."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    params: SamplingParams
    stream: bool = False


def parse_generate_body(body: Any, *, new_rid: Callable[[], str] = lambda: uuid.uuid4().hex) -> GenerateItem:
    """A `/generate` JSON body's request; RequestError where SGLang refuses it, and for what the client
    never sends: a batch (a list of prompts) or a text prompt."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    ids, sp, rid = body.get("input_ids"), body.get("sampling_params"), body.get("rid")
    if not (
        (ids is None or isinstance(ids, list) and all(type(t) is int for t in ids))
        and (sp is None or isinstance(sp, dict)) and (rid is None or isinstance(rid, str))
        and isinstance(body.get("stream", False), bool) and body.get("text") is None
    ):  # fmt: skip
        raise RequestError("a field of the body has a bad type (batches and text prompts are not served)")
    if not ids:
        raise RequestError("input_ids cannot be empty.")
    sp = dict(sp or {})
    rid = new_rid() if rid is None else rid
    return GenerateItem(rid, list(ids), sp, SamplingParams.from_request(sp), bool(body.get("stream")))


def validate_item(item: GenerateItem, *, context_len: int, vocab_size: int | None) -> None:
    """The context-length checks, then the sampling bounds, for one item (RequestError)."""
    n, requested = len(item.input_ids), item.sampling_params.get("max_new_tokens")
    if n >= context_len or (requested is not None and requested + n > context_len):
        raise RequestError(f"{n} input tokens and max_new_tokens {requested} exceed the context length {context_len}.")
    if vocab_size is not None and (min(item.input_ids) < 0 or max(item.input_ids) >= vocab_size):
        # SGLang fails inside the model; the engine refuses it up front instead of crashing its worker.
        raise RequestError(f"input_ids hold a token id outside the vocabulary [0, {vocab_size}).")
    item.params.verify(vocab_size if vocab_size is not None else 1 << 62)


def effective_max_new_tokens(input_len: int, max_new_tokens: int | None, context_len: int) -> int:
    """scheduler.init_req_max_new_tokens: clamped to `(context_len - 1) - input_len - 1`, so a request of
    input + max_new_tokens == context_len still ends 2 tokens early, as on SGLang."""
    requested = max_new_tokens if max_new_tokens is not None else 1 << 30
    return max(0, min(requested, (context_len - 1) - input_len - 1))


# -- the answer (tokenizer_manager._handle_batch_output): its keys in SGLang's order
def build_response(*, rid: str, text: str, output_ids: Sequence[int], finish_reason: dict[str, Any],
                   prompt_tokens: int | None, num_retractions: int = 0, e2e_latency: float = 0.0,
                   queue_time: float | None = None) -> dict[str, Any]:  # fmt: skip
    """A non-streamed answer for one request. A request aborted before it ran has no `prompt_tokens`
    (pass None); `queue_time` is what `--enable-metrics` adds."""
    n = len(output_ids)
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish_reason}
    if prompt_tokens is None:
        meta.update({"weight_version": "default", "e2e_latency": e2e_latency, "completion_tokens": n})
    else:
        meta.update({"prompt_tokens": prompt_tokens, "weight_version": "default", "num_retractions": num_retractions})
        meta.update({} if queue_time is None else {"queue_time": queue_time})
        meta.update({"reasoning_tokens": 0, "completion_tokens": n, "cached_tokens": 0,
                     "weight_versions": [{"version": "default", "start": 0, "end": n}],
                     "cached_tokens_details": None, "dp_rank": None, "e2e_latency": e2e_latency})  # fmt: skip
    meta["response_sent_to_client_ts"] = time.time()
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def partial_meta(rid: str, *, prompt_tokens: int, completion_tokens: int, num_retractions: int = 0) -> dict:
    """The `meta_info` of a streamed chunk of an unfinished request."""
    return {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens, "weight_version": "default",
            "num_retractions": num_retractions, "reasoning_tokens": 0, "completion_tokens": completion_tokens,
            "cached_tokens": 0, "cached_tokens_details": None, "dp_rank": None}  # fmt: skip


def dumps(data: Any) -> bytes:
    """JSON as SGLang writes it (orjson: compact UTF-8)."""
    return orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
