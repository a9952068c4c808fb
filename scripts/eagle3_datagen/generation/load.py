"""The server's load, read from SGLang's load endpoint, and `client.concurrency: auto`, which follows it
(docs/slurm.md): what the server runs plus a short queue, so the KV cache a finishing request frees
finds successors queued, yet too few to be retracted or to wait long.
"""

import math
from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class Load:
    """One reading of the servers' load, summed over data-parallel ranks (and servers)."""

    running: int
    waiting: int
    used_tokens: int = 0
    ranks: int = 1

    def __add__(self, other: "Load") -> "Load":
        return Load(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def parse_loads(data) -> Load:
    """A `/v1/loads` object (0.5.8 on: {"loads": [per DP rank: num_running_reqs, num_waiting_reqs, ...]})
    or a `/get_load` list (gone in 0.5.23; num_reqs counts running and waiting) as one `Load`; else ValueError."""
    try:
        if isinstance(data, dict) and isinstance(data.get("loads"), list) and data["loads"]:
            ranks = data["loads"]
            return Load(
                running=sum(int(r["num_running_reqs"]) for r in ranks),
                waiting=sum(int(r["num_waiting_reqs"]) for r in ranks),
                used_tokens=sum(int(r.get("num_used_tokens", 0)) for r in ranks),
                ranks=len(ranks),
            )
        if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
            waiting = sum(int(r["num_waiting_reqs"]) for r in data)
            return Load(
                running=sum(int(r["num_reqs"]) for r in data) - waiting,
                waiting=waiting,
                used_tokens=sum(int(r.get("num_tokens", 0)) for r in data),
                ranks=len(data),
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a {'/v1/loads' if isinstance(data, dict) else '/get_load'} answer: {exc!r}") from None
    raise ValueError(f"not a load answer: {str(data)[:200]}")


class Concurrency:
    """The number of requests to keep in flight (`limit`): fixed, or following the servers' load (auto).
    Pure logic: the client calls `observe` at every poll of the load endpoint and `retracted` for every
    answer that reports retractions. Auto grows while nothing waits and every slot is in use (doubling
    at start, then by `STEP`); after the first sign of a full server it follows what the servers run."""

    STEP = 0.05  # after slow start: the share of the limit (at least 1) a poll may add
    QUEUE_SHARE = 0.2  # the queue's target as a share of what runs (where more than queue_target)

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
    """Requests in flight, the limit and the servers' counts, a point per poll (thinned at `max_points`)."""

    max_points: int = 2000

    def __post_init__(self):
        self.points: list[tuple] = []
        self.every = 1
        self._seen = 0

    def add(self, t: float, in_flight: int, limit: int, load: Load | None) -> None:
        self._seen += 1
        if (self._seen - 1) % self.every:
            return
        running, waiting = (None, None) if load is None else (load.running, load.waiting)
        self.points.append((round(t, 3), in_flight, limit, running, waiting))
        if len(self.points) >= self.max_points:
            self.points = self.points[::2]
            self.every *= 2

    def as_columns(self) -> dict:
        names = ("t", "in_flight", "limit", "running", "waiting")
        return {name: [p[i] for p in self.points] for i, name in enumerate(names)}
