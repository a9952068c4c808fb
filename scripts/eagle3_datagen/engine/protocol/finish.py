"""Finish reasons and the stopping rules of SGLang 0.5.23, shared by both backends.

- `srt/managers/schedule_batch.py` `FINISH_*.to_json`: the finish-reason dicts; `Req.update_finish_state`
  and `_check_token_based_finish`: which token or string ends a request, in which order.
- `srt/managers/tokenizer_manager.py` `_handle_abort_req`: a request aborted before it ran.
- `srt/managers/detokenizer_manager.py` `trim_matched_stop`: how `text` drops the matched stop.

Imports `protocol.sampling` only.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eagle3_datagen.engine.protocol.sampling import SamplingParams


def finish_matched_token(token_id: int) -> dict[str, Any]:
    return {"type": "stop", "matched": int(token_id)}


def finish_matched_str(stop_str: str) -> dict[str, Any]:
    return {"type": "stop", "matched": stop_str}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": int(length)}


def finish_abort(
    message: str | None = None, status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    """FINISH_ABORT: a running request aborted by /abort_request or a disconnect."""
    return {
        "type": "abort",
        "message": message or "Aborted",
        "status_code": status_code,
        "err_type": err_type,
    }


def finish_abort_waiting(message: str | None = None) -> dict[str, Any]:
    """tokenizer_manager._handle_abort_req: a request aborted before it ran."""
    return {"type": "abort", "message": message or "Abort in waiting queue"}


def stop_token_ids(eos_token_ids: Iterable[int], params: SamplingParams) -> frozenset:
    """The ids that end generation: the model's EOS set plus the request's `stop_token_ids`.

    `_check_token_based_finish` returns early under `ignore_eos`, so then no id stops at all —
    the request's own `stop_token_ids` included.
    """
    if params.ignore_eos:
        return frozenset()
    return frozenset(eos_token_ids) | params.stop_token_ids


def min_new_tokens_banned(eos_token_ids: Iterable[int], params: SamplingParams) -> frozenset:
    """Ids the min-new-tokens penalizer masks until `min_new_tokens` tokens exist."""
    return frozenset(eos_token_ids) | params.stop_token_ids


def check_finish(
    output_ids: Sequence[int],
    *,
    params: SamplingParams,
    stop_ids: frozenset,
    max_new_tokens: int,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> dict[str, Any] | None:
    """Finish reason after the last token of `output_ids` was appended, or None to go on.

    Order as `Req.update_finish_state`: stop string, then stop token, then length.
    """
    if params.stop_strs and decode is not None and output_ids:
        text = decode(output_ids)
        for s in params.stop_strs:
            if s and s in text:
                return finish_matched_str(s)
    if output_ids and output_ids[-1] in stop_ids:
        return finish_matched_token(output_ids[-1])
    if len(output_ids) >= max_new_tokens:
        return finish_length(max_new_tokens)
    return None


def text_ids(output_ids: Sequence[int], finish_reason: dict[str, Any] | None, no_stop_trim: bool):
    """The ids `text` is decoded from: a matched stop token is dropped unless `no_stop_trim`."""
    ids = list(output_ids)
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, int) and not isinstance(matched, bool) and not no_stop_trim and ids:
        return ids[:-1]
    return ids


def trim_stop_str(text: str, finish_reason: dict[str, Any] | None, no_stop_trim: bool) -> str:
    """detokenizer_manager.trim_matched_stop for a matched stop string."""
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, str):
        pos = text.find(matched)
        if pos == -1:
            return text
        return text[: pos + len(matched)] if no_stop_trim else text[:pos]
    return text
