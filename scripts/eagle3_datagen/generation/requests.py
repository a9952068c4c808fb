"""What is sent for one row: a request's identity (id, sample, turn, mode), its rid, its /generate body and
its fingerprint (the identity of its result, which the journal and the plan key on). Imports only
`settings`, no network code: a plan is made without the HTTP client loaded.
"""

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from eagle3_datagen.settings import DEFAULT_MODE, canonical_json


def row_label(row_id: str, sample_index: int, turn: int = 0, mode: str = DEFAULT_MODE) -> str:
    """`{id}.{sample}[.t{turn}][@{mode}]`: a row as logs and messages name it, and its rids begin."""
    return f"{row_id}.{sample_index}" + (f".t{turn}" if turn else "") + (f"@{mode}" if mode != DEFAULT_MODE else "")


@dataclass
class Request:
    """What the client sends for one (id, sample_index, turn, mode) row; `template`: its mode's (None: the client's)."""

    id: str
    sample_index: int
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int
    fingerprint: str = ""
    turn: int = 0
    mode: str = DEFAULT_MODE
    template: "RequestTemplate | None" = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, int, int, str]:
        return (self.id, self.sample_index, self.turn, self.mode)

    @property
    def label(self) -> str:
        return row_label(*self.key)

    def continued(self, received: list[int]) -> "Request":
        """The same row's request going on after the `received` ids of its answer (its identity stays)."""
        return dataclasses.replace(
            self, prompt_ids=self.prompt_ids + received, max_new_tokens=self.max_new_tokens - len(received)
        )

    def rid(self, nonce: str, attempt: int) -> str:
        """SGLang's request id for one attempt, unique per attempt and run (SGLang rejects a rid in flight)."""
        return f"{self.label}.{nonce}.{attempt}"


class SentRid(NamedTuple):
    """What a rid the client made says: its row (`Request.key`), the run's nonce and the attempt."""

    row: tuple[str, int, int, str]
    nonce: str
    attempt: int


def parse_rid(rid: str) -> SentRid:
    """Read back `Request.rid`: `{id}.{sample}[.t{turn}][@{mode}].{nonce}.{attempt}` (ids may hold dots)."""
    head, nonce, attempt = rid.rsplit(".", 2)
    head, last = head.rsplit(".", 1)
    mode = DEFAULT_MODE
    if "@" in last:
        last, mode = last.split("@", 1)
    turn = 0
    if last.startswith("t") and last[1:].isdigit() and head.rsplit(".", 1)[-1].isdigit() and "." in head:
        turn = int(last[1:])
        head, last = head.rsplit(".", 1)
    return SentRid((head, int(last), turn, mode), nonce, int(attempt))


@dataclass
class RequestTemplate:
    """The parts of every request body that do not vary by row."""

    sampling: dict
    stop_token_ids: list[int]
    vocab_size: int
    model_fingerprint: dict = field(default_factory=dict)
    _model_json: bytes | None = field(default=None, repr=False, compare=False)
    _orjson_agrees: bool | None = field(default=None, repr=False, compare=False)

    def body(self, req: Request, rid: str, stream_interval: int | None = None) -> bytes:
        """The /generate body of one attempt, as JSON bytes; with `stream_interval`, a streamed one."""
        body = {"input_ids": req.prompt_ids, "sampling_params": self.sampling_params(req), "rid": rid}
        if stream_interval is not None:
            body["sampling_params"]["stream_interval"], body["stream"] = int(stream_interval), True
        return orjson.dumps(body)

    def sampling_params(self, req: Request) -> dict:
        # Every value explicit: /generate applies none of the model's generation_config defaults.
        return {
            **self.sampling,
            "max_new_tokens": req.max_new_tokens,
            "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "sampling_seed": req.seed,
        }

    def _sampling_json(self, params: dict) -> bytes:
        """`canonical_json(params)`, by orjson where it writes the same bytes (checked on the first request)."""
        try:
            fast = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer beyond 64 bits
            return canonical_json(params)
        if self._orjson_agrees is None:
            self._orjson_agrees = fast == canonical_json(params)
        return fast if self._orjson_agrees else canonical_json(params)

    def fingerprint(self, req: Request) -> str:
        """Identity of the request's result: the same fingerprint always means the same generation. It is
        `stable_hash([model_fingerprint, prompt_ids, sampling_params, sample_index])`, byte for byte."""
        if self._model_json is None:
            self._model_json = canonical_json(self.model_fingerprint)
        ids, params = orjson.dumps(req.prompt_ids), self._sampling_json(self.sampling_params(req))
        parts = (self._model_json, ids, params, str(int(req.sample_index)).encode())
        return hashlib.sha256(b"[" + b",".join(parts) + b"]").hexdigest()
