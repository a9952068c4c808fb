"""What is sent for one row: a request's identity (id, sample, turn, mode), its rid, its /generate body and
its fingerprint (the identity of its result, which the journal and the plan key on).

Planning, turns and the client all import this module; it imports only `settings` and no network
code, so a plan is made without the HTTP client loaded.
"""

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson

from eagle3_datagen.settings import DEFAULT_MODE, canonical_json


@dataclass
class Request:
    """What the client sends for one (id, sample_index, turn, mode) row. `template` is how it is
    sent (its mode's sampling); without one, the client's."""

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
        return (
            f"{self.id}.{self.sample_index}"
            + (f".t{self.turn}" if self.turn else "")
            + (f"@{self.mode}" if self.mode != DEFAULT_MODE else "")
        )

    def continued(self, received: list[int]) -> "Request":
        """The same row's request going on after the `received` ids of its answer: they end its
        prompt, and the budget is what is left. Its identity (key, fingerprint, seed) is the row's:
        the journal keeps the one answer under it."""
        return dataclasses.replace(
            self, prompt_ids=self.prompt_ids + received, max_new_tokens=self.max_new_tokens - len(received)
        )

    def rid(self, nonce: str, attempt: int) -> str:
        """SGLang's request id for one attempt: unique per attempt and per run (`nonce`), since SGLang
        rejects a rid still in flight, and an attempt from before a restart may still run on an
        external server. `parse_rid` reads it back."""
        return f"{self.label}.{nonce}.{attempt}"


class SentRid(NamedTuple):
    """What a rid the client made says: the row it was sent for (`Request.key`: id, sample_index,
    turn, mode), the run's nonce and the attempt. Read it by name: the row's shape has grown before."""

    row: tuple[str, int, int, str]
    nonce: str
    attempt: int


def parse_rid(rid: str) -> SentRid:
    """The row, run nonce and attempt of a rid the client made:
    `{id}.{sample}[.t{turn}][@{mode}].{nonce}.{attempt}` (ids may hold dots; the turn is there from
    turn 1, the mode for a profile's named modes)."""
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
        """The /generate body of one attempt, as JSON bytes; with `stream_interval`, a streamed one
        (its output sent every that many tokens). How an answer is delivered is no part of what is
        generated: the fingerprint leaves it out."""
        params = self.sampling_params(req)
        if stream_interval is None:
            return orjson.dumps({"input_ids": req.prompt_ids, "sampling_params": params, "rid": rid})
        params["stream_interval"] = int(stream_interval)
        return orjson.dumps({"input_ids": req.prompt_ids, "sampling_params": params, "rid": rid, "stream": True})

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
        """`canonical_json(params)`, by orjson where it writes the same bytes: checked on the first
        request, since only integers (budget, seed) differ from one request to the next, and orjson
        writes integers as the standard library does (it differs on some floats, e.g. 1e-05)."""
        try:
            fast = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer beyond 64 bits
            return canonical_json(params)
        if self._orjson_agrees is None:
            self._orjson_agrees = fast == canonical_json(params)
        return fast if self._orjson_agrees else canonical_json(params)

    def fingerprint(self, req: Request) -> str:
        """Identity of the request's result: the same fingerprint always means the same generation.

        `stable_hash([model_fingerprint, prompt_ids, sampling_params, sample_index])`, byte for byte,
        with the prompt ids (the bulk) written by orjson: a list of integers comes out the same as
        from the standard library's canonical form, and the rest is small."""
        if self._model_json is None:
            self._model_json = canonical_json(self.model_fingerprint)
        digest = hashlib.sha256(b"[")
        digest.update(self._model_json)
        digest.update(b",")
        digest.update(orjson.dumps(req.prompt_ids))
        digest.update(b",")
        digest.update(self._sampling_json(self.sampling_params(req)))
        digest.update(b"," + str(int(req.sample_index)).encode() + b"]")
        return digest.hexdigest()
