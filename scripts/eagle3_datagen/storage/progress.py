"""Progress of a long local step, said where people look: rows done of the total, percent, rate,
time elapsed and an ETA, in the rule's log and on stderr, which Snakemake shows in its terminal.

Imports nothing of the package.
"""

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

# A line at least this often after the first interval, and sooner when another tenth is done (but
# not within a tenth of the interval of the last line).
INTERVAL_S = 10.0
SHARE_STEP = 0.1


def duration(seconds: float, *, tenths: bool = True) -> str:
    """A span of time as a clock reads it: "0.4 s" (tenths below 10 s, or else whole seconds, at
    least 1), "42 s", "3 min 20 s", "2 h 5 min"."""
    if seconds < 10 and tenths:
        return f"{max(seconds, 0.0):.1f} s"
    whole = max(round(seconds), 0 if tenths else 1)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def rate_text(per_second: float) -> str:
    """A rate with thousands separators, one decimal below 10."""
    return f"{per_second:,.0f}" if per_second >= 10 else f"{per_second:.1f}"


class Progress:
    """Progress lines of one step over `total` units (None: not known ahead; `advance` may then give a
    `fraction` of the work), to the step's logger, marked `progress`: one at the start, then about every
    `interval_s` (never within the first), and one at the end. Tests drive `clock` by hand."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        unit: str = "rows",
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.interval_s = interval_s
        self.clock = clock
        self.log = log or logging.getLogger(label)
        self.done = 0
        self.fraction: float | None = None
        self.started: float | None = None
        self.last = 0.0  # when the last line was written
        self.last_share = 0.0  # the share done at the last line

    def start(self) -> None:
        """The first line: what the step is about to go through."""
        self.started = self.last = self.clock()
        known = self.total is not None
        self._say(
            f"0 of {self.total:,} {self.unit}" if known else f"0 {self.unit} (the total is known once all are read)"
        )

    def advance(self, n: int, fraction: float | None = None) -> None:
        """`n` more units done (and, where the total is not known, `fraction` of the work)."""
        if self.started is None:
            self.start()
        self.done += n
        if fraction is not None:
            self.fraction = min(max(fraction, 0.0), 1.0)
        if self.total is not None and self.done >= self.total:
            return  # the last line says it
        now = self.clock()
        if now - self.started < self.interval_s:
            return
        share = self.share()
        since = now - self.last
        another_tenth = (
            share is not None
            and math.floor(share / SHARE_STEP) > math.floor(self.last_share / SHARE_STEP)
            and since >= self.interval_s * SHARE_STEP
        )
        if since >= self.interval_s or another_tenth:
            self._say(self.line(now))
            self.last, self.last_share = now, share or 0.0

    def share(self) -> float | None:
        """The share of the work done, 0 to 1, or None where nothing says it."""
        if self.total is not None:
            return min(self.done / self.total, 1.0) if self.total else 1.0
        return self.fraction

    def line(self, now: float) -> str:
        """Done (of total), percent, rate, elapsed time and the time left at the rate so far."""
        elapsed = now - (self.started if self.started is not None else now)
        share = self.share()
        parts = [f"{self._counts()} {self.unit}" + (f" ({math.floor(share * 100)}%)" if share is not None else "")]
        if elapsed > 0:
            parts.append(f"{rate_text(self.done / elapsed)} {self.unit}/s")
        parts.append(f"{duration(elapsed)} elapsed")
        if share:
            parts.append(f"ETA {duration(elapsed * (1 - share) / share, tenths=False)}")
        elif share is not None:
            parts.append("ETA not known yet")
        return ", ".join(parts)

    def finish(self) -> None:
        """The last line: how many, in how long."""
        if self.started is None:
            self.start()
        elapsed = self.clock() - self.started
        rate = f", {rate_text(self.done / elapsed)} {self.unit}/s" if elapsed > 0 else ""
        self._say(f"{self._counts()} {self.unit} done in {duration(elapsed)}{rate}")

    def _counts(self) -> str:
        return f"{self.done:,} of {self.total:,}" if self.total is not None else f"{self.done:,}"

    def _say(self, text: str) -> None:
        self.log.info("%s", text, extra={"progress": True})


class ProgressOnly(logging.Filter):
    """Passes progress lines only: `workflow.setup_logging` sends them to stderr too."""

    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, "progress", False))


def job_wildcards(log_file: str | Path) -> tuple[str, ...]:
    """What names a job besides its rule, from its log file's path under `logs/`:
    logs/check_sequences/math.log -> ("math",), logs/generate/math/shard_0.log -> ("math", "shard_0"),
    logs/summarize.log -> ()."""
    parts = Path(log_file).with_suffix("").parts
    if "logs" in parts:
        parts = parts[len(parts) - parts[::-1].index("logs") :]
    return tuple(parts[1:])


def terminal_format(log_file: str | Path | None) -> str:
    """The format of progress lines on the terminal: the time, the step and the job's wildcards, so that
    jobs side by side can be told apart ("21:07:02 check_sequences math: 1,234 of 12,345 rows ...")."""
    wildcards = " ".join(job_wildcards(log_file)) if log_file else ""
    return "%(asctime)s %(name)s" + (" " + wildcards.replace("%", "%%") if wildcards else "") + ": %(message)s"
