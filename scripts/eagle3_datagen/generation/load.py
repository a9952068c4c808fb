"""The server's load, read from SGLang's load endpoint, and `client.concurrency: auto`, which follows it.

How many requests to keep in flight depends on the server: too few and its batch runs below what it
could hold (the GPU idles); too many and its scheduler admits more than its KV cache holds, then
retracts running requests (`num_retractions` in an answer's `meta_info`), which must be prefilled
again. The right number moves with prompt and answer lengths, across categories and over a run.

`Concurrency` reads the server's own view at every poll, summed over its data-parallel ranks and
over the servers of a job: requests running, requests waiting in its queue, KV tokens in use. It
keeps the waiting queue at a small target (`client.queue_target` per rank, or a fifth of what
runs): then the KV cache a finishing request frees always finds successors already queued, yet
requests never wait long in the server (nor time out there, nor leave a multi-turn conversation's
prefix to be evicted from its cache). Start-up doubles the limit while the queue is short (slow
start); after the first sign of a full server (a queue over its target on two readings in a row,
or a retraction) the limit follows what the server runs, and it never grows at a retraction.

The endpoints (confirmed in SGLang's source):
- `GET /v1/loads` (0.5.8 and later; 0.5.23 `srt/entrypoints/v1_loads.py`): {"loads": [one object per
  DP rank with num_running_reqs, num_waiting_reqs, num_used_tokens, max_total_num_tokens,
  max_running_requests, ...], "timestamp", "version", ...}.
- `GET /get_load` (deprecated in 0.5.8, gone in 0.5.23): [{dp_rank, num_reqs, num_waiting_reqs,
  num_tokens, ts_tic}, ...], where num_reqs counts running and waiting requests together.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """One reading of the servers' load, summed over data-parallel ranks (and servers)."""

    running: int
    waiting: int
    used_tokens: int = 0
    total_tokens: int = 0
    max_running: int = 0
    ranks: int = 1

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.total_tokens if self.total_tokens else 0.0

    def __add__(self, other: "Load") -> "Load":
        return Load(
            self.running + other.running,
            self.waiting + other.waiting,
            self.used_tokens + other.used_tokens,
            self.total_tokens + other.total_tokens,
            self.max_running + other.max_running,
            self.ranks + other.ranks,
        )


def parse_loads(data) -> Load:
    """A `/v1/loads` object or a `/get_load` list as one `Load`; ValueError for anything else."""
    if isinstance(data, dict) and isinstance(data.get("loads"), list) and data["loads"]:
        ranks = data["loads"]
        try:
            return Load(
                running=sum(int(r["num_running_reqs"]) for r in ranks),
                waiting=sum(int(r["num_waiting_reqs"]) for r in ranks),
                used_tokens=sum(int(r.get("num_used_tokens", 0)) for r in ranks),
                total_tokens=sum(int(r.get("max_total_num_tokens", 0)) for r in ranks),
                max_running=sum(int(r.get("max_running_requests", 0)) for r in ranks),
                ranks=len(ranks),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a /v1/loads answer: {exc!r}") from None
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        try:
            waiting = sum(int(r["num_waiting_reqs"]) for r in data)
            return Load(
                running=sum(int(r["num_reqs"]) for r in data) - waiting,
                waiting=waiting,
                used_tokens=sum(int(r.get("num_tokens", 0)) for r in data),
                ranks=len(data),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a /get_load answer: {exc!r}") from None
    raise ValueError(f"not a load answer: {str(data)[:200]}")


class Concurrency:
    """The number of requests the client may have in flight: fixed, or following the servers' load.

    Pure logic, no clock and no I/O: the client calls `observe` at every poll of the load endpoint
    and `retracted` for every answer that reports retractions; `limit` is the number to keep in
    flight. Fixed (`auto=False`), the limit never moves.

    Auto: the limit is what the servers run plus the queue's target, read anew at every poll. The
    target is `queue_target` per data-parallel rank, and at least a fifth of what runs (`QUEUE_SHARE`):
    the KV cache that finishing requests free must find successors already queued, and a server
    that runs more frees more at once. While the queue is empty and every slot is in use, the limit
    grows (doubling at start, then by steps of `STEP`); after a retraction it never grows at that poll.
    """

    # After slow start, each poll with an empty queue and every slot in use raises the limit by
    # this share of it (at least 1).
    STEP = 0.05
    # The queue's target as a share of the requests running (when that is more than queue_target).
    QUEUE_SHARE = 0.2

    def __init__(self, cap: int, *, auto: bool = False, queue_target: int = 4, start: int | None = None):
        if cap < 1:
            raise ValueError(f"a concurrency cap must be at least 1, not {cap}")
        self.cap = cap
        self.auto = auto
        self.queue_target = max(0, queue_target)
        self.limit = min(cap, start or 8) if auto else cap
        self.slow_start = auto
        self._queued_readings = 0  # slow start: readings in a row with the queue over its target
        self._retractions = 0
        self.retractions = 0  # all seen
        self.cuts = 0

    def retracted(self, n: int) -> None:
        """An answer reported `n` retractions (meta_info.num_retractions)."""
        if n > 0:
            self._retractions += n
            self.retractions += n

    def target(self, load: Load) -> int:
        """Requests to keep waiting in the servers' queues."""
        return max(self.queue_target * max(load.ranks, 1), math.ceil(self.QUEUE_SHARE * load.running))

    def observe(self, load: Load, in_flight: int) -> int:
        """A reading of the servers' load, with the client's requests in flight at that moment; returns the limit."""
        if not self.auto:
            return self.limit
        target = self.target(load)
        retractions, self._retractions = self._retractions, 0
        # Grow only on a reading that has caught up with what was sent: requests still on their way
        # are not in the server's counts, and a server that has not seen them looks like it has room.
        caught_up = load.running + load.waiting + target >= in_flight
        if self.slow_start:
            if not retractions and load.waiting <= target:
                self._queued_readings = 0
                if in_flight >= self.limit and caught_up:
                    self.limit = min(self.cap, 2 * self.limit)
                return self.limit
            self._queued_readings += 1
            if not retractions and self._queued_readings < 2:
                # A queue at one reading may be requests just sent that the server has not yet
                # admitted: full is a queue that outlasts a poll interval (or a retraction).
                return self.limit
            self.slow_start = False  # the first sign of a full server
        if not caught_up and not retractions and load.waiting <= target:
            return self.limit  # the reading lags what was sent: it says nothing about the limit
        limit = load.running + target
        if retractions:
            # The scheduler ran out of KV cache and put requests back in its queue: what it runs
            # now plus the queue, never more than before. (Not below that: SGLang admits by its own
            # estimate and retracts to pack long-tailed answers, so a limit under what it runs
            # leaves KV cache idle; bench/README.md, concurrency.py.)
            self.cuts += 1
            limit = min(limit, self.limit)
        elif load.waiting == 0 and in_flight >= self.limit and caught_up:
            # Every slot in use and nothing waits: the server could run more.
            limit = max(limit, self.limit + max(1, math.floor(self.limit * self.STEP)))
        self.limit = max(1, min(self.cap, limit))
        return self.limit


@dataclass
class Timeline:
    """Requests in flight over a run, with the limit and the servers' running and waiting counts, a
    point per poll; thinned to every other point when it reaches `max_points`, so it stays small."""

    max_points: int = 2000

    def __post_init__(self):
        self.points: list[tuple] = []
        self.every = 1
        self._seen = 0

    def add(self, t: float, in_flight: int, limit: int, load: Load | None) -> None:
        self._seen += 1
        if (self._seen - 1) % self.every:
            return
        running = waiting = None if load is None else 0
        if load is not None:
            running, waiting = load.running, load.waiting
        self.points.append((round(t, 3), in_flight, limit, running, waiting))
        if len(self.points) >= self.max_points:
            self.points = self.points[::2]
            self.every *= 2

    def as_columns(self) -> dict:
        names = ("t", "in_flight", "limit", "running", "waiting")
        return {name: [p[i] for p in self.points] for i, name in enumerate(names)}
