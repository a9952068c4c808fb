"""Repetition loops in token ids: an output that ends in one n-gram repeated many times.

What is counted: the shortest period `p` (1 to `max_period` tokens) such that the output's last
`covered` tokens repeat with period `p` (every token equals the one `p` before it), where `covered`
holds the first copy too. A loop is flagged when `covered >= max(min_tokens, min_repeats * p)`:
at least `min_tokens` tokens and at least `min_repeats` whole copies of the n-gram, ending the output.
Repetition that changes from copy to copy (a table's rows, a numbered list, code whose lines differ
in a name or a number) breaks the period and is never counted; a verbatim repeat (a chorus sung
twice, a ruler of `=`) is counted only while it covers `min_tokens`.

`find_loop` looks at a finished output; `LiveLoopWatch` is fed an output chunk by chunk as it is
generated and reports the loop as soon as the output received so far ends in one covering twice the
tokens (`LoopSettings.live`), so that a loop costs the tokens up to its detection instead of up to
`max_new_tokens`. An output the watch stopped is one `find_loop` flags.
"""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LoopSettings:
    """When an output's repeated tail is a loop (config `quality.loop`; defaults in the schema)."""

    min_tokens: int = 256
    min_repeats: int = 4
    max_period: int = 256

    def need(self, period: int) -> int:
        """Tokens a loop of this period must cover."""
        return max(self.min_tokens, self.min_repeats * period)

    @property
    def window(self) -> int:
        """The tail of an output that decides whether it ends in a loop."""
        return self.need(self.max_period)

    def live(self) -> "LoopSettings":
        """The settings of the live stop: twice the tokens. A flag after the fact only sees how an
        output ended, while a stop mid-answer also cuts repetition that the answer would have left
        (an empty grid drawn for 300 tokens, then filled in): the stop waits for more evidence, and
        the output it stops is one the flag marks too."""
        return LoopSettings(min_tokens=2 * self.min_tokens, min_repeats=self.min_repeats, max_period=self.max_period)

    def to_json(self) -> dict:
        return {"min_tokens": self.min_tokens, "min_repeats": self.min_repeats, "max_period": self.max_period}


@dataclass(frozen=True)
class Loop:
    """A loop found at the end of an output: its period, the tokens it covers, where it starts."""

    period: int
    covered: int
    start: int

    @property
    def repeats(self) -> float:
        return self.covered / self.period

    def describe(self) -> str:
        return (
            f"the last {self.covered} tokens repeat a {self.period}-token n-gram "
            f"{self.repeats:.1f} times (from output token {self.start})"
        )


def _as_array(ids) -> np.ndarray:
    return ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.int64)


def find_loop(ids, settings: LoopSettings, end: int | None = None) -> Loop | None:
    """The loop `ids[:end]` ends in, with the shortest period, or None.

    Cost: one comparison of the last token against the `max_period` before it, then, for each
    period whose token matches (usually a handful), one vectorized comparison over the tokens a loop
    of that period must cover; the run is measured backwards only for a period that is a loop."""
    x = _as_array(ids)
    n = len(x) if end is None else end
    if n < settings.min_tokens or n < 2:
        return None
    # Periods p (1..max_period) with x[n-1] == x[n-1-p] and x[n-2] == x[n-2-p], shortest first.
    top = min(settings.max_period, n - 2)
    last = x[n - top - 1 : n - 1][::-1] == x[n - 1]
    second = x[n - top - 2 : n - 2][::-1] == x[n - 2]
    for p in (np.flatnonzero(last & second) + 1).tolist():
        need = settings.need(p)
        if need > n:
            break  # need grows with p
        if not (x[n - need + p : n] == x[n - need : n - p]).all():
            continue
        covered = need + _run_back(x, n - need, p)
        return Loop(period=p, covered=covered, start=n - covered)
    return None


def _run_back(x: np.ndarray, stop: int, p: int) -> int:
    """How many positions i < stop (going back from stop-1) still satisfy x[i] == x[i+p]."""
    run, i, step = 0, stop, 1024
    while i > 0:
        lo = max(0, i - step)
        eq = x[lo:i] == x[lo + p : i + p]
        if eq.all():
            run += i - lo
            i = lo
            continue
        return run + (i - lo - 1 - int(np.flatnonzero(~eq)[-1]))
    return run


class LiveLoopWatch:
    """Watches one output as it streams in: `feed(chunk)` after each chunk of new ids; it returns the
    loop once the output so far ends in one by the `settings.live()` thresholds (then the request is
    stopped), else None.

    Only the last `window` tokens decide, so the watch keeps only those (and the count): its memory
    and its work per chunk stay the same however long the output grows."""

    def __init__(self, settings: LoopSettings):
        self.settings = settings.live()
        self.window = self.settings.window
        self._buf = np.zeros(4 * self.window, dtype=np.int64)  # the tail, appended in place
        self._end = 0
        self.n = 0  # tokens fed so far

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
        if self.n < self.settings.min_tokens:
            return None
        loop = find_loop(self.tail, self.settings)
        if loop is None:
            return None
        # The tail holds only the window: a loop that fills it may run further back; its true
        # extent is measured when the whole output is looked at (find_loop on the finished row).
        return Loop(period=loop.period, covered=loop.covered, start=self.n - loop.covered)
