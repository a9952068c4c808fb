"""What paces the client: `Slots` (the in-flight limit, resizable while in use), `Deadlines` (request
timeouts kept by one watchdog task) and `Progress` (the periodic progress line). Imports nothing of
the package.
"""

import asyncio
import logging
import re
import time
from collections import Counter, deque
from collections.abc import Callable

# The progress line is the client's line in a job's log: it keeps the client's logger name.
log = logging.getLogger("eagle3_datagen.generation.client")


def retry_kind(reason: str) -> str:
    """A retry reason's kind: its words before the first colon or number ("timed out", "no chunk",
    "stream cut short", "connection error"), an error's status kept ("HTTP 503", "stream error 503")."""
    head = reason.split(":", 1)[0]
    if not head.startswith(("HTTP", "stream error")):
        head = re.sub(r"\s*(\b(after|for))?\s*\d.*", "", head)
    return head.strip() or reason[:40]


class Progress:
    """A periodic progress line: done/total, requests/s, tokens/s, ETA, and the retries by kind."""

    # Why requests are retried, in the job's log at INFO: the first few retries of each kind of reason
    # with their row, attempt and whole reason (a storm of one kind stays a few lines, a new kind is
    # still seen at once), and from then on the count per kind on each progress line.
    RETRIES_LOGGED = 3

    def __init__(self, total: int, interval_s: float, label: str):
        self.total, self.interval_s, self.label = total, interval_s, label
        self.done = self.failed = self.retries = self.tokens = 0
        self.retry_kinds: Counter[str] = Counter()
        self.started = self._last = time.monotonic()
        self.note: Callable[[], str] | None = None  # more to say on each line

    def add(self, *, tokens: int = 0, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        self.tokens += tokens
        now = time.monotonic()
        if now - self._last >= self.interval_s or self.done == self.total:
            self._last = now
            self.log()

    def retried(self, row: str, attempt: int, reason: str, delay_s: float) -> None:
        """Count a retry of `row` after its `attempt` failed for `reason`; log it while its kind is new."""
        self.retries += 1
        kind = retry_kind(reason)
        self.retry_kinds[kind] += 1
        if self.retry_kinds[kind] <= self.RETRIES_LOGGED:
            more = " (further retries of this kind are counted on the progress line)"
            log.info(
                "%s: %s attempt %d: %s; retrying in %.1f s%s",
                self.label,
                row,
                attempt,
                reason,
                delay_s,
                more if self.retry_kinds[kind] == self.RETRIES_LOGGED else "",
            )

    def rates(self) -> tuple[float, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return self.done / elapsed, self.tokens / elapsed

    def log(self) -> None:
        rps, tps = self.rates()
        eta = f"{(self.total - self.done) / rps:.0f} s" if rps > 0 else "-"
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.retry_kinds.most_common())
        log.info(
            "%s: %d/%d rows (%d failed, %d retries%s) | %.2f req/s | %.0f tok/s | ETA %s%s",
            self.label,
            self.done,
            self.total,
            self.failed,
            self.retries,
            f": {kinds}" if kinds else "",
            rps,
            tps,
            eta,
            self.note() if self.note else "",
        )


class Slots:
    """A semaphore whose size may change while it is in use: a lower limit takes effect as slots are given
    back; a freed slot goes straight to the first waiter, as asyncio.Semaphore does."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._waiters: deque[asyncio.Future] = deque()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    async def acquire(self) -> None:
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # the slot is counted as held when the future is resolved
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot, then cancelled before taking it
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        self.held -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.held < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.held += 1
                fut.set_result(None)


class Deadlines:
    """Request timeouts kept by one watchdog task instead of a timer per request (which costs more on uvloop
    than the rest of a request's bookkeeping); `expired` tells its cancellations from any other, and why.

    A streamed request (`stream`: an object whose `seen` is the `time.monotonic()` of its last chunk) is
    cut only once its deadline has passed AND nothing came for `idle_s`: a slow answer that is still
    arriving runs on. Each chunk costs its reader one float stored; the watchdog reads it only for a
    request past its deadline, and pushes that deadline to `seen + idle_s`."""

    TICK_SHARE = 0.05

    def __init__(self):
        self._deadlines: dict[asyncio.Task, list] = {}  # task: [deadline, timeout_s, stream or None, idle_s, pushed]
        self._expired: dict[asyncio.Task, str] = {}
        self._tick = 1.0
        self._watchdog: asyncio.Task | None = None

    def watch(self, task: asyncio.Task, timeout_s: float, stream=None, idle_s: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        if stream is not None:
            stream.seen = time.monotonic()  # the send counts as a chunk: nothing came for 0 s
        self._deadlines[task] = [loop.time() + timeout_s, timeout_s, stream, idle_s, False]
        self._tick = min(self._tick, max(min(timeout_s, idle_s or timeout_s) * self.TICK_SHARE, 0.001))
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())

    def forget(self, task: asyncio.Task) -> None:
        self._deadlines.pop(task, None)
        self._expired.pop(task, None)

    def expired(self, task: asyncio.Task) -> str | None:
        """Why the watchdog cancelled `task` ("timed out after N s", "no chunk for N s"), or None."""
        return self._expired.get(task)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._deadlines:
            await asyncio.sleep(self._tick)
            now = loop.time()
            for task, entry in list(self._deadlines.items()):
                if now < entry[0] or task in self._expired:
                    continue
                _, timeout_s, stream, idle_s, pushed = entry
                reason = f"timed out after {timeout_s:.0f} s"
                if stream is not None:
                    quiet = time.monotonic() - stream.seen
                    if quiet < idle_s:  # still arriving
                        entry[0], entry[4] = now + idle_s - quiet, True
                        continue
                    if pushed:
                        reason = f"no chunk for {quiet:.0f} s"
                self._expired[task] = reason
                task.cancel()

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
