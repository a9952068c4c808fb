"""Repetition loops in token ids: an output whose tail is dominated by one n-gram repeated many
times, even where a few of its tokens differ (a model looping at temperature 1.0 wobbles).

For each period `p` each tail token is compared with the tokens one and two periods away; it scores
+1 on the n-gram, `-(1 + a)` off it (`a = (1 - 2m) / 2m`, `m = max_mismatch`), and a further `-p`
where copies keep differing at the same place (a counter, a table's values), so that such text is
never a loop. The loop is the highest-scoring suffix; it is flagged when it covers `need(p)` tokens,
at most `max_mismatch` of them off the n-gram (docs/quality.md has the whole account and why).

`find_loop` looks at a finished output; `LiveLoopWatch` is fed an output chunk by chunk as it is
generated and reports the loop by the stricter `LoopSettings.live` thresholds, so that a loop costs
the tokens up to its detection instead of up to `max_new_tokens`. An output it stopped is one
`find_loop` flags.
"""

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SCREEN = 16  # the last tokens every period is screened on
CANDIDATES = 12  # periods scored at most, those with the fewest mismatches in the screen


@dataclass(frozen=True)
class LoopSettings:
    """When an output's repeated tail is a loop (config `quality.loop`; defaults in the schema)."""

    min_tokens: int = 256
    min_repeats: int = 4
    max_period: int = 256
    max_mismatch: float = 0.1
    min_tokens_at_budget: int = 16
    min_repeats_at_budget: int = 16

    def need(self, period: int, at_budget: bool = False) -> int:
        """Tokens a loop of this period must cover (at the end of an output cut by its budget, or not)."""
        need = max(self.min_tokens, self.min_repeats * period)
        if at_budget:
            need = min(need, max(self.min_tokens_at_budget, self.min_repeats_at_budget * period))
        return need

    @property
    def window(self) -> int:
        """The tail of an output that decides whether it ends in a loop (with four periods before it)."""
        return self.need(self.max_period) + 4 * self.max_period

    @property
    def weight(self) -> float:
        """What a token off the n-gram costs beyond the match it is not: `a` of the module doc."""
        return (1 - 2 * self.max_mismatch) / (2 * self.max_mismatch)

    def live(self) -> "LoopSettings":
        """The settings of the live stop: twice the tokens. A flag after the fact only sees how an
        output ended, while a stop mid-answer also cuts repetition that the answer would have left
        (an empty grid drawn for 300 tokens, then filled in): the stop waits for more evidence, and
        the output it stops is one the flag marks too."""
        return dataclasses.replace(self, min_tokens=2 * self.min_tokens)

    to_json = dataclasses.asdict


@dataclass(frozen=True)
class Loop:
    """A loop at the end of an output: its period, the tokens it covers, its start, its tokens off the n-gram."""

    period: int
    covered: int
    start: int
    mismatches: int = 0

    def describe(self) -> str:
        differ = f", {self.mismatches} of them off the n-gram" if self.mismatches else ""
        return (
            f"the last {self.covered} tokens repeat a {self.period}-token n-gram "
            f"{self.covered / self.period:.1f} times (from output token {self.start}{differ})"
        )


def _as_array(ids) -> np.ndarray:
    return ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.int64)


def _screen(x: np.ndarray, n: int, top: int) -> dict[int, int]:
    """Per period 1..top that one of the last 4 tokens of `x[:n]` repeats from a period before: how
    many of the last `SCREEN` tokens differ from the token a period before them (a loop whose last 4
    tokens all differ from the copy before is seen a chunk later, or never if it is that far off)."""
    back = _back(top)
    periods = np.flatnonzero((x[n - 4 : n, None] == x[n + back[-4:]]).any(axis=0)) + 1
    k = min(SCREEN, n - top)
    before = x[n + back[-k:, periods - 1]]
    misses = k - np.count_nonzero(x[n - k : n, None] == before, axis=0)
    return dict(zip(periods.tolist(), misses.tolist()))


@lru_cache(maxsize=8)
def _back(top: int) -> np.ndarray:
    """[r, p - 1]: the offset from the end of the token a period p before the screen's row r."""
    return np.arange(-SCREEN, 0)[:, None] - np.arange(1, top + 1)


def _candidates(x: np.ndarray, n: int, settings: LoopSettings, at_budget: bool) -> list[int]:
    """The periods whose tokens equal the ones a period before in at least half of the last `SCREEN`
    tokens, fewest mismatches first (at most `CANDIDATES`). A multiple of a period that passes is left
    out unless it matches clearly better: a loop of period p matches at every multiple of p too, and a
    few deviant tokens in the screen must not let those crowd p itself out."""
    top = min(settings.max_period, n - SCREEN)
    if top < 1:
        return []
    misses = _screen(x, n, top)
    kept: list[int] = []
    for p, miss in misses.items():
        if 2 * miss > SCREEN:
            continue
        if settings.need(p, at_budget) > n:
            break  # need grows with p
        if not any(p % d == 0 and misses[d] <= miss + 4 for d in kept):
            kept.append(p)
    kept.sort(key=misses.get)
    return kept[:CANDIDATES]


def _score(y: np.ndarray, p: int, weight: float) -> tuple[int, float, int]:
    """(where the best-scoring suffix of `y` begins, its score, its deviant tokens) for period `p`."""
    m = len(y)
    agree = np.zeros(m, dtype=np.int8)  # neighbours (one and two copies away) equal to the token
    seen = np.zeros(m, dtype=np.int8)  # neighbours there are
    for k in (p, 2 * p):
        if k < m:
            same = y[k:] == y[:-k]
            agree[k:] += same
            agree[:-k] += same
            seen[k:] += 1
            seen[:-k] += 1
    deviant = 2 * agree < seen  # fewer than half of its neighbours agree (none, at an end)
    d = 1.0 - (1.0 + weight) * deviant
    if m > 3 * p:  # charged where the run of deviant copies starts: the text before a loop starts none in it
        d[: -3 * p] -= p * (deviant[: -3 * p] & deviant[p : -2 * p] & deviant[2 * p : -p] & deviant[3 * p :])
    suffix = np.cumsum(d[::-1])[::-1]
    best = int(np.argmax(suffix))
    return best, float(suffix[best]), int(deviant[best:].sum())


def find_loop(ids, settings: LoopSettings, end: int | None = None, at_budget: bool = False) -> Loop | None:
    """The loop `ids[:end]` ends in, or None (`at_budget`: the output was cut by its budget).

    Of the candidate periods that pass, the shortest whose loop scores nearly the highest; its extent
    is then measured over the whole output, not only the tail that decided."""
    x = _as_array(ids)
    n = len(x) if end is None else end
    if n < 2 or n < settings.need(1, at_budget):
        return None
    return _judge(x, n, _candidates(x, n, settings, at_budget), settings, at_budget)


def _judge(x: np.ndarray, n: int, candidates: list[int], settings: LoopSettings, at_budget: bool) -> Loop | None:
    lo = max(0, n - settings.window)
    y = x[lo:n]
    m = len(y)
    passed = {}
    for p in candidates:
        need = settings.need(p, at_budget)
        # A loop's last `need` tokens equal the copy before them but where one of the two is off the
        # n-gram: at least 1 - 2 * max_mismatch of them. Cheaper than scoring, and most candidates fail it.
        if (y[m - need + p :] == y[m - need : m - p]).sum() < (1 - 2 * settings.max_mismatch) * (need - p) - 2:
            continue
        start, score, mismatches = _score(y, p, settings.weight)
        if score > 0 and mismatches <= settings.max_mismatch * (m - start) and m - start >= need:
            passed[p] = score
    if not passed:
        return None
    # A multiple of the period scores as well as the period itself, give or take the noise of a
    # few deviant tokens: the shortest period that scores nearly the best is the loop's.
    best = max(passed.values())
    p = min(q for q, score in passed.items() if score >= 0.8 * best)
    start, _, mismatches = _score(x[:n], p, settings.weight) if lo else _score(y, p, settings.weight)
    return Loop(period=p, covered=n - start, start=start, mismatches=mismatches)


class LiveLoopWatch:
    """Watches one output as it streams in: `feed(chunk)` returns the loop once the output so far ends
    in one by the `settings.live()` thresholds, else None.

    Only the last `window` tokens decide, so the watch keeps only those: its memory and work per chunk
    stay the same however long the output grows. Where no period passes the screen, no loop can cover
    `need(1)` tokens before `need(1) - SCREEN` more have come: the watch looks again only then."""

    def __init__(self, settings: LoopSettings):
        self.settings = settings.live()
        self.window = self.settings.window
        self._buf = np.zeros(4 * self.window, dtype=np.int64)  # the tail, appended in place
        self._end = 0
        self.n = 0  # tokens fed so far
        self._quiet_until = self.settings.min_tokens  # no loop can be seen before this many tokens

    @property
    def tail(self) -> np.ndarray:
        """The last `window` tokens fed (fewer at first)."""
        return self._buf[max(0, self._end - self.window) : self._end]

    def _append(self, chunk: np.ndarray) -> None:
        k = len(chunk)
        if k >= self.window:
            self._buf[: self.window] = chunk[-self.window :]
            self._end = self.window
            return
        if self._end + k > len(self._buf):  # move the tail to the front, once every few windows
            keep = self.window - k
            self._buf[:keep] = self._buf[self._end - keep : self._end]
            self._end = keep
        self._buf[self._end : self._end + k] = chunk
        self._end += k

    def feed(self, chunk) -> Loop | None:
        if not len(chunk):
            return None
        self._append(_as_array(chunk))
        self.n += len(chunk)
        if self.n < self._quiet_until:
            return None
        tail = self.tail
        candidates = _candidates(tail, len(tail), self.settings, False)
        if not candidates:
            self._quiet_until = self.n + self.settings.need(1) - SCREEN
            return None
        loop = _judge(tail, len(tail), candidates, self.settings, False)
        if loop is None:
            return None
        # The tail holds only the window: a loop that fills it may run further back; its true
        # extent is measured when the whole output is looked at (find_loop on the finished row).
        return Loop(loop.period, loop.covered, self.n - loop.covered, loop.mismatches)
