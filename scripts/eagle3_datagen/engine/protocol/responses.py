"""The answer to a `/generate` request and its `meta_info`, as SGLang 0.5.23 builds them.

- `srt/managers/tokenizer_manager.py` `_handle_batch_output`, `_wait_one_response`: the keys of a
  non-streamed answer, in order (`build_response`, and `PreparedResponse` for canned answers).
- `srt/observability/req_time_stats.py`: what `--enable-metrics` adds (`metrics_meta_info`).
- `srt/managers/detokenizer_manager.py`: the `text` of an answer (`decode_output_text`).

Imports `protocol.sampling` and `protocol.finish`.
"""

import time
from collections.abc import Sequence
from typing import Any

import orjson

from eagle3_datagen.engine.protocol.finish import text_ids, trim_stop_str
from eagle3_datagen.engine.protocol.sampling import SamplingParams

DEFAULT_WEIGHT_VERSION = "default"


def decode_output_text(
    tokenizer: Any,
    output_ids: Sequence[int],
    finish_reason: dict[str, Any] | None,
    params: SamplingParams,
) -> str:
    """`text` of a response: decode as the detokenizer does, then trim the matched stop."""
    ids = text_ids(output_ids, finish_reason, params.no_stop_trim)
    text = tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
    return trim_stop_str(text, finish_reason, params.no_stop_trim)


def build_response(
    *,
    rid: str,
    text: str,
    output_ids: Sequence[int],
    finish_reason: dict[str, Any],
    prompt_tokens: int | None,
    cached_tokens: int = 0,
    num_retractions: int = 0,
    e2e_latency: float = 0.0,
    weight_version: str = DEFAULT_WEIGHT_VERSION,
    response_sent_ts: float | None = None,
    scheduler_metrics: dict[str, Any] | None = None,
    request_metrics: dict[str, Any] | None = None,
    completion_tokens: int | None = None,
) -> dict[str, Any]:
    """A non-streamed `/generate` answer for one request (tokenizer_manager._handle_batch_output).

    A request aborted before it ran has no `prompt_tokens` (`_handle_abort_req`): pass None. Every
    finished answer also carries `response_sent_to_client_ts` (wall-clock seconds), which 0.5.23's
    `_wait_one_response` adds last, once the request has finished (default: now). A request the
    scheduler finished carries `finished_meta_info` after `cached_tokens`.

    With `--enable-metrics` SGLang adds two groups of keys (`metrics_meta_info` builds them): the
    scheduler's time stats right after `num_retractions`, the tokenizer's after `e2e_latency`.

    `completion_tokens` (default: the number of `output_ids`) is for a streamed chunk that carries
    only its new ids.
    """
    n = len(output_ids) if completion_tokens is None else completion_tokens
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish_reason}
    if prompt_tokens is None:
        # _handle_abort_req: no scheduler output, hence no weight-version spans.
        meta.update({"weight_version": weight_version, "e2e_latency": e2e_latency, "completion_tokens": n})
        meta["response_sent_to_client_ts"] = time.time() if response_sent_ts is None else response_sent_ts
        return {"text": text, "output_ids": list(output_ids), "meta_info": meta}
    meta.update({"prompt_tokens": prompt_tokens, "weight_version": weight_version, "num_retractions": num_retractions})
    if scheduler_metrics:
        meta.update(scheduler_metrics)
    meta.update({"reasoning_tokens": 0, "completion_tokens": n, "cached_tokens": cached_tokens})
    meta.update(finished_meta_info(n, cached_tokens, weight_version))
    meta["e2e_latency"] = e2e_latency
    if request_metrics:
        meta.update(request_metrics)
    meta["response_sent_to_client_ts"] = time.time() if response_sent_ts is None else response_sent_ts
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def finished_meta_info(completion_tokens: int, cached_tokens: int, weight_version: str) -> dict[str, Any]:
    """The keys 0.5.23 adds to a finished request's `meta_info` after `cached_tokens`
    (tokenizer_manager._handle_batch_output): `weight_versions`, the spans of output tokens each weight
    version produced (`utils/weight_versions.add_weight_versions_to_meta_info`: one span, weights
    never change here); `cached_tokens_details`, null without a prefix hit, else the hit by tier
    (scheduler_components/output_streamer.get_cached_tokens_details: all of it on the device);
    `dp_rank`, null without data parallelism."""
    details = {"device": cached_tokens, "host": 0} if cached_tokens > 0 else None
    return {
        "weight_versions": [{"version": weight_version, "start": 0, "end": completion_tokens}],
        "cached_tokens_details": details,
        "dp_rank": None,
    }


def metrics_meta_info(
    *,
    received_ts: float,
    forward_entry_ts: float,
    prefill_finished_ts: float,
    queue_time: float,
    finished_ts: float,
    completion_tokens: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `--enable-metrics` keys of a finished answer: (scheduler part, tokenizer part), wall-clock.

    Scheduler part: `SchedulerReqTimeStats.convert_to_output_meta_info`
    (srt/observability/req_time_stats.py): `storage_prefetch_wait` and `storage_staging_wait` (0.0:
    `set_wait_queue_entry_time` starts them with metrics on, no storage tier ever blocks here),
    `forward_entry_time`, `prefill_finished_time`, then `queue_time` (`queue_duration_s`: the time
    spent in the waiting queue, summed over every stay, retractions included).

    Tokenizer part: `APIServerReqTimeStats.convert_to_output_meta_info`: `request_received_ts`,
    `first_token_latency` (a non-streamed request's first token is the scheduler's
    `prefill_finished_time`, `_get_scheduler_first_token_time`), `api_server_dispatch_finish_ts`,
    `request_finished_ts`, and `decode_throughput` when more than one token was decoded over a
    positive time.
    """
    sched: dict[str, Any] = {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0}
    if forward_entry_ts > 0.0:
        sched["forward_entry_time"] = forward_entry_ts
    if prefill_finished_ts > 0.0:
        sched["prefill_finished_time"] = prefill_finished_ts
    sched["queue_time"] = queue_time
    req: dict[str, Any] = {"request_received_ts": received_ts}
    first = prefill_finished_ts if received_ts < prefill_finished_ts <= finished_ts else finished_ts
    if first > received_ts:
        req["first_token_latency"] = first - received_ts
    req["api_server_dispatch_finish_ts"] = received_ts
    req["request_finished_ts"] = finished_ts
    if completion_tokens > 1 and finished_ts - first > 0.0:
        req["decode_throughput"] = (completion_tokens - 1) / (finished_ts - first)
    return sched, req


class PreparedResponse:
    """A non-streamed answer serialized once, for answers that repeat (the scripted `--canned` mode).

    `render` fills in the per-request fields (`meta_info.id`, `prompt_tokens`, `e2e_latency`,
    `response_sent_to_client_ts`) and returns the bytes of exactly what `build_response` gives for
    the same values, in the same key order.
    """

    __slots__ = ("text", "output_ids", "finish_reason", "_head", "_mid", "_tail")

    def __init__(
        self,
        *,
        text: str,
        output_ids: Sequence[int],
        finish_reason: dict[str, Any],
        weight_version: str = DEFAULT_WEIGHT_VERSION,
    ):
        self.text = text
        self.output_ids = tuple(output_ids)
        self.finish_reason = finish_reason
        self._head = b'{"text":' + orjson.dumps(text) + b',"output_ids":' + orjson.dumps(list(output_ids))
        self._head += b',"meta_info":{"id":'
        self._mid = b',"finish_reason":' + orjson.dumps(finish_reason) + b',"prompt_tokens":'
        n = len(self.output_ids)
        fixed = b',"num_retractions":0,"reasoning_tokens":0,"completion_tokens":%d,"cached_tokens":0,' % n
        finished = orjson.dumps(finished_meta_info(n, 0, weight_version))[1:-1]  # the keys, without braces
        self._tail = b',"weight_version":' + orjson.dumps(weight_version) + fixed + finished + b',"e2e_latency":'

    def render(self, rid: str, prompt_tokens: int, e2e_latency: float, response_sent_ts: float) -> bytes:
        return b"".join(
            (
                self._head,
                orjson.dumps(rid),
                self._mid,
                b"%d" % prompt_tokens,
                self._tail,
                orjson.dumps(e2e_latency),
                b',"response_sent_to_client_ts":',
                orjson.dumps(response_sent_ts),
                b"}}",
            )
        )
