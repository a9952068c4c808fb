"""The chunks of a streamed `/generate` answer, as SGLang 0.5.23 builds them.

- `srt/entrypoints/http_server.py` `serve_generate_request`: the framing, `data: <json>\\n\\n` per
  chunk and `data: [DONE]\\n\\n` last (`sse`, `SSE_DONE`); a ValueError of the tokenizer manager
  (a request refused after the schema check) is one `{"error": {...}}` chunk of a 200 answer
  (`error_chunk`).
- `srt/managers/tokenizer_manager.py` `_handle_batch_output`: an unfinished chunk's `meta_info`
  (`partial_meta`: no `e2e_latency`, no `weight_versions`); with `--incremental-streaming-output`
  a chunk carries only its new `output_ids` and `text`, else all of them so far;
  `_wait_one_response`: queued chunks are coalesced (deltas joined, the rest from the last one) and
  `response_sent_to_client_ts` is set on the first chunk sent only; `_handle_abort_req`: a request
  aborted before it ran ends with all its text, and (incremental) `[output_ids[-1]]` only.
- `srt/managers/detokenizer_manager.py`: text decoded incrementally, held back while it ends in an
  incomplete character (`StreamText`).

Imports `protocol.sampling` and `protocol.responses`.
"""

from collections.abc import Sequence
from typing import Any

from eagle3_datagen.engine.protocol.responses import DEFAULT_WEIGHT_VERSION, decode_output_text
from eagle3_datagen.engine.protocol.sampling import SamplingParams

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"  # Starlette adds the charset to text/* types
SSE_DONE = b"data: [DONE]\n\n"


def sse(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def error_chunk(message: str, code: int = 400) -> dict[str, Any]:
    """The chunk a streamed request refused by the tokenizer manager gets (before `[DONE]`)."""
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


def partial_meta(
    rid: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    num_retractions: int = 0,
    weight_version: str = DEFAULT_WEIGHT_VERSION,
) -> dict[str, Any]:
    """The `meta_info` of a chunk of an unfinished request."""
    return {
        "id": rid,
        "finish_reason": None,
        "prompt_tokens": prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": num_retractions,
        "reasoning_tokens": 0,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "cached_tokens_details": {"device": cached_tokens, "host": 0} if cached_tokens > 0 else None,
        "dp_rank": None,
    }


class StreamText:
    """A streamed request's text: deltas decoded incrementally (a window from the last confirmed
    offset, so that a long answer is not decoded again per chunk), the final one from the whole
    answer's text as a non-streamed answer has it (stop trimmed)."""

    def __init__(self, tokenizer: Any, params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.text = ""  # every delta so far
        self._surr = 0
        self._read = 0

    def _decode(self, ids: Sequence[int]) -> str:
        p = self.params
        return self.tokenizer.decode(
            list(ids),
            skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens,
        )

    def advance(self, output_ids: Sequence[int], n: int) -> str:
        """The new text of `output_ids[:n]` ("" while it ends in an incomplete character)."""
        if n <= self._read:
            return ""
        surr_text = self._decode(output_ids[self._surr : self._read])
        new_text = self._decode(output_ids[self._surr : n])
        if len(new_text) <= len(surr_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(surr_text) :]
        self._surr, self._read = self._read, n
        self.text += delta
        return delta

    def finish(self, output_ids: Sequence[int], finish_reason: dict[str, Any] | None, full: str | None) -> str:
        """The last delta: the rest of the whole text (`full`, else decoded as a non-streamed answer)."""
        if full is None:
            full = decode_output_text(self.tokenizer, output_ids, finish_reason, self.params)
        delta = full[len(self.text) :]
        self.text = full
        return delta
