"""A simulated GPU in virtual time, as a pure object (no threads, no clock): `KVScheduler`. At most
`max_running_requests` run, their KV (prompt plus output so far) within `max_total_tokens`.
Admission is FIFO while a slot is free and the KV in use, every running request's reserve and the
newcomer's prompt and reserve fit; a reserve is the remaining budget clipped to `clip_max_new_tokens`,
as SGLang's admission estimate is, so longer answers outgrow it (a request alone always starts). A
step prefills what was admitted (a first token each), else decodes a token per running request,
first retracting the fewest-output requests to the back of the queue (tokens kept, prefilled again)
until it fits; one left alone that does not fit is refused (HTTP 500). `step()` returns the step's
duration (`StepModel`); the caller advances time. Imports nothing of the engine.
"""

import dataclasses
from collections.abc import Hashable
from typing import Any

MAX_PREFILL_TOKENS = 16384  # prompt tokens one prefill step takes at most (the first request always goes)
OOM_MESSAGE = "Out of memory even after retracting all other requests in the decode batch."


@dataclasses.dataclass(frozen=True)
class StepModel:
    """One forward pass: `base_ms + per_request_ms * batch` ms `+ per_kv_token_us * kv_tokens +
    prefill_per_token_us * prefill_tokens` us."""

    base_ms: float = 2.0
    per_request_ms: float = 0.02
    per_kv_token_us: float = 0.0
    prefill_per_token_us: float = 0.5

    def seconds(self, batch_size: int, kv_tokens: int, extend_tokens: int) -> float:
        ms = self.base_ms + self.per_request_ms * batch_size
        return ms / 1e3 + (self.per_kv_token_us * kv_tokens + self.prefill_per_token_us * extend_tokens) / 1e6


@dataclasses.dataclass(eq=False)
class RequestStats:
    """A request as the scheduler tracks it (times in virtual seconds), and what it reports on leaving."""

    key: Hashable
    prompt_len: int
    answer_len: int
    max_new_tokens: int
    output_len: int = 0
    num_retractions: int = 0
    queue_time: float = 0.0
    wait_since: float = 0.0
    error: str | None = None
    status_code: int | None = None

    @property
    def kv(self) -> int:
        return self.prompt_len + self.output_len


class KVScheduler:
    """The simulated GPU of the module docstring; `add` queues a request whose answer length is known."""

    def __init__(self, max_running_requests: int, max_total_tokens: int, *, step_model: StepModel | None = None,
                 context_length: int | None = None, clip_max_new_tokens: int = 4096):  # fmt: skip
        if max_running_requests < 1 or max_total_tokens < 1:
            raise ValueError("max_running_requests and max_total_tokens must be positive")
        self.max_running_requests, self.max_total_tokens = max_running_requests, max_total_tokens
        self.step_model, self.clip = step_model or StepModel(), clip_max_new_tokens
        self.max_req_input_len = min(context_length or max_total_tokens, max_total_tokens) - 6
        self.clock, self.decode_steps, self.busy_us = 0.0, 0, {"prefill": 0.0, "decode": 0.0}
        self.waiting: list[RequestStats] = []
        self.running: list[RequestStats] = []
        self._refused: list[RequestStats] = []
        self._reqs: dict[Hashable, RequestStats] = {}
        self.admitted: list[Hashable] = []  # keys the last step admitted

    def clip_max_new_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """The budget a request really gets: its answer must fit the empty pool."""
        return max(0, min(max_new_tokens, self.max_total_tokens - prompt_len - 2))

    @property
    def used_tokens(self) -> int:
        return sum(r.kv for r in self.running)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self._refused)

    def add(self, key: Hashable, prompt_len: int, answer_len: int, max_new_tokens: int) -> None:
        """Queue a request of `prompt_len` tokens that will generate `answer_len` (at least 1)."""
        req = RequestStats(key, prompt_len, max(1, min(answer_len, max_new_tokens)), max_new_tokens)
        req.wait_since = self.clock
        self._reqs[key] = req
        if prompt_len > self.max_req_input_len:
            req.error, req.status_code = f"The input ({prompt_len} tokens) does not fit the KV pool.", 400
            self._refused.append(req)
        else:
            self.waiting.append(req)

    def abort(self, key: Hashable) -> RequestStats | None:
        """Take a request out (None if unknown); its stats as of now."""
        req = self._reqs.pop(key, None)
        for queue in (self.waiting, self.running, self._refused):
            if req in queue:
                queue.remove(req)
        return req

    def progress(self, key: Hashable) -> int:
        req = self._reqs.get(key)
        return req.output_len if req is not None else 0

    def _reserve(self, req: RequestStats) -> int:
        return min(req.max_new_tokens - req.output_len, self.clip)

    def _admit(self) -> list[RequestStats]:
        """The waiting requests the next prefill takes (FIFO, while slots and KV allow)."""
        budget = self.max_total_tokens - sum(r.kv + self._reserve(r) for r in self.running)
        batch: list[RequestStats] = []
        prefill = 0
        while self.waiting and len(self.running) + len(batch) < self.max_running_requests:
            req = self.waiting[0]
            need = req.kv + self._reserve(req)
            if (need > budget and (batch or self.running)) or (batch and prefill + req.kv > MAX_PREFILL_TOKENS):
                break
            budget, prefill = budget - need, prefill + req.kv
            batch.append(self.waiting.pop(0))
        return batch

    def step(self) -> tuple[list[RequestStats], float]:
        """One forward pass: (requests that left, its duration in seconds)."""
        finished, self._refused = self._refused, []
        batch = self._admit()
        self.admitted = [r.key for r in batch]
        if batch:
            extend = sum(r.kv for r in batch)
            for req in batch:
                req.queue_time += self.clock - req.wait_since
            self.running += batch
            seconds = self.step_model.seconds(len(batch), extend, extend)
            self.busy_us["prefill"] += seconds * 1e6
        elif self.running:
            finished += self._retract()
            seconds = self.step_model.seconds(len(self.running), self.used_tokens, 0)
            self.busy_us["decode"] += seconds * 1e6
            self.decode_steps += 1
            batch = self.running
        else:
            batch, seconds = [], 0.0
        for req in batch:
            req.output_len += 1
        self.clock += seconds
        finished += [r for r in self.running if r.output_len >= r.answer_len]
        self.running = [r for r in self.running if r.output_len < r.answer_len]
        for req in finished:
            self._reqs.pop(req.key, None)
        return finished, seconds

    def _retract(self) -> list[RequestStats]:
        """Make room for a decode step: retract the shortest outputs first; refuse the last if need be."""
        while self.used_tokens + len(self.running) > self.max_total_tokens:
            if len(self.running) == 1:
                req = self.running.pop()
                req.error, req.status_code = OOM_MESSAGE, 500
                return [req]
            victim = min(self.running, key=lambda r: (r.output_len, -r.prompt_len))
            self.running.remove(victim)
            victim.num_retractions += 1
            victim.wait_since = self.clock
            self.waiting.append(victim)
        return []

    def load(self, *, timestamp: float = 0.0) -> dict[str, Any]:
        """This rank's `/v1/loads` entry."""
        return load_entry(
            running=len(self.running), waiting=len(self.waiting), used=self.used_tokens,
            waiting_tokens=sum(r.kv for r in self.waiting), max_total_tokens=self.max_total_tokens,
            max_running_requests=self.max_running_requests, timestamp=timestamp,
            prefill_busy_us=self.busy_us["prefill"],
            decode_moments=[self.decode_steps, 0.0, self.busy_us["decode"], 0.0, 0.0, 0.0] if self.decode_steps else None,
        )  # fmt: skip


def load_entry(*, running: int, waiting: int, used: int, waiting_tokens: int, max_total_tokens: int,
               max_running_requests: int, timestamp: float, prefill_busy_us: float = 0.0,
               decode_moments: list | None = None) -> dict[str, Any]:  # fmt: skip
    """One rank's entry of SGLang's `/v1/loads` (the fields the client reads, and the busy time the
    benchmarks read: `total_prefill_busy_us`, and `decode_moments[2]`, the decode steps' us)."""
    return {
        "timestamp": timestamp, "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
        "num_used_tokens": used, "num_total_tokens": used + waiting_tokens, "max_total_num_tokens": max_total_tokens,
        "max_running_requests": max_running_requests, "token_usage": round(used / max_total_tokens, 4),
        "total_prefill_busy_us": prefill_busy_us, "decode_moments": decode_moments,
    }  # fmt: skip
