"""Repetition loops made on purpose, for tests and benchmarks of loop detection: which requests loop,
where and with which period (`LoopInjection.plan` -> `LoopPlan`), and the output such a request gives.
A request is drawn from a hash of its row (the rid without the client's run nonce and attempt, so
that every retry and every run draws the same), or of its prompt when the rid has no such parts.
Imports nothing of the engine.
"""

import dataclasses
import hashlib
import random
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """A request that loops: from output position `onset` on, its output repeats the `period`
    tokens before the onset (stop ids replaced by a filler) until `max_new_tokens`."""

    onset: int
    period: int

    def ngram(self, prefix: Sequence[int], stop_ids: frozenset, filler: Callable[[], int]) -> list[int]:
        """The repeated n-gram: the last `period` tokens of `prefix` (filler where too short or a stop id)."""
        window = list(prefix[max(0, len(prefix) - self.period) :])
        window = [filler() for _ in range(self.period - len(window))] + window
        return [t if t not in stop_ids else filler() for t in window]

    def apply(self, planned: Sequence[int], max_new_tokens: int, stop_ids: frozenset, filler: Callable[[], int]):
        """A planned output turned into a loop: its first `onset` tokens (without stop ids, filled up
        where it ended earlier), then the n-gram repeated up to `max_new_tokens` tokens."""
        head = [t for t in planned[: self.onset] if t not in stop_ids]
        head += [filler() for _ in range(self.onset - len(head))]
        if max_new_tokens <= self.onset:
            return head[:max_new_tokens]
        gram = self.ngram(head, stop_ids, filler)
        tail = max_new_tokens - self.onset
        return head + (gram * (tail // self.period + 1))[:tail]

    def forced(self, output_ids: Sequence[int], gram: list[int]) -> int | None:
        """The token a looping row must produce next (None before the onset)."""
        pos = len(output_ids)
        return None if pos < self.onset else gram[(pos - self.onset) % self.period]


@dataclasses.dataclass(frozen=True)
class LoopInjection:
    """Which share of requests loops (`share`), where (`onset`, output tokens, inclusive range) and
    with which period (`period`, inclusive range); `seed` varies the draw."""

    share: float = 0.0
    onset: tuple[int, int] = (256, 1024)
    period: tuple[int, int] = (1, 32)
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"the loop share must be in [0, 1], got {self.share}")
        for name, (lo, hi) in (("onset", self.onset), ("period", self.period)):
            if not 0 <= lo <= hi or (name == "period" and lo < 1):
                raise ValueError(f"bad loop {name} range {lo},{hi}")

    def plan(self, rid: str, input_ids: Sequence[int]) -> LoopPlan | None:
        """The loop of the request (`rid`, `input_ids`), or None when it does not loop."""
        if self.share <= 0.0:
            return None
        h = hashlib.sha256(f"{self.seed}\0".encode())
        row = row_key(rid)
        h.update(row.encode() if row is not None else repr(list(input_ids)).encode())
        rng = random.Random(int.from_bytes(h.digest()[:8], "big"))
        if rng.random() >= self.share:
            return None
        return LoopPlan(onset=rng.randint(*self.onset), period=rng.randint(*self.period))


def row_key(rid: str) -> str | None:
    """The row part of a client's rid `{row}.{nonce}.{attempt}`, or None for any other rid."""
    parts = rid.rsplit(".", 2)
    return parts[0] if len(parts) == 3 and parts[0] and parts[2].isdigit() else None
