"""A shard's progress: published by its generate job, read by `status` from any host, at any time.

The job writes `<journal>.progress.json` (its plan, counts, host, state, the journal's size then), replaced
whole so that a reader, NFS included, never sees half of one; writing it never stops the job. A reader adds
the journal's lines past that size (`tail`) and asks the lock whether the job lives (`lock_held`): a
shard costs the same to read at any size, and a job killed with SIGKILL shows every row it journalled.
"""

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from eagle3_datagen.generation.locks import ShardLock

log = logging.getLogger(__name__)

SUFFIX = ".progress.json"
# Samples of (time, rows done, output tokens) kept for the recent rate; the rate spans RATE_WINDOW_S.
KEEP_S = 900.0
RATE_WINDOW_S = 300.0
RUNNING = ("starting", "sending")


def planned_rows(plan: dict) -> int:
    """The rows a shard's plan will have journalled (at most: a conversation may end early)."""
    return plan["reused"] + plan["to_send"] + plan["later_turns"]


def progress_path(journal: str | Path) -> Path:
    journal = Path(journal)
    return journal.with_name(journal.name + SUFFIX)


class ShardProgress:
    """What a generate job publishes about its shard (`progress_path(journal)`)."""

    def __init__(
        self,
        journal: str | Path,
        *,
        category: str,
        shard: int,
        shards: int,
        plan: dict,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ):
        self.path, self.journal = progress_path(journal), Path(journal)
        self.interval_s, self.clock = interval_s, clock
        now = clock()
        self.facts = {
            "category": category,
            "shard": shard,
            "shards": shards,
            "state": "starting",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "started": now,
            "updated": now,
            "planned": planned_rows(plan),
            "reused": plan["reused"],
            "reused_output_tokens": plan.get("reused_output_tokens", 0),
            "skipped": plan["skipped"],
            "to_send": plan["to_send"] + plan["later_turns"],
            "sent": {"done": 0, "failed": 0, "retries": 0, "output_tokens": 0, "in_flight": 0, "limit": None},
            "journal_bytes": 0,
            "samples": [[now, 0, 0]],
            "error": None,
        }
        self._last = float("-inf")
        self._warned = False
        self.publish()

    def update(self, sent: dict, *, state: str = "sending", force: bool = False) -> None:
        """The client's counts (the keys of `facts["sent"]`), published once `interval_s` has passed (or `force`)."""
        now = self.clock()
        self.facts["sent"] = {**self.facts["sent"], **sent}
        self.facts["state"] = state
        samples = self.facts["samples"]
        if now - samples[-1][0] >= min(self.interval_s, 60.0) or force:
            samples.append([now, self.facts["sent"]["done"], self.facts["sent"]["output_tokens"]])
            while len(samples) > 2 and now - samples[1][0] > KEEP_S:
                samples.pop(0)
        if force or now - self._last >= self.interval_s:
            self.publish()

    def finish(self, error: BaseException | None = None) -> None:
        """The job's end: `done`, or `failed` with the error's first line."""
        if isinstance(error, SystemExit | KeyboardInterrupt):
            self.facts["error"] = (
                f"stopped by a signal ({type(error).__name__} {error}): a time limit, scancel or Ctrl-C"
            )
        elif error is not None:
            self.facts["error"] = (str(error).strip().splitlines() or [type(error).__name__])[0][:500]
        self.update({}, state="failed" if error is not None else "done", force=True)

    def publish(self) -> None:
        """Replace the file whole; a failure (a full disk) is logged once and never stops the job."""
        now = self._last = self.clock()
        self.facts["updated"] = now
        try:
            self.facts["journal_bytes"] = self.journal.stat().st_size
        except OSError:
            self.facts["journal_bytes"] = 0
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(orjson.dumps(self.facts))
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if not self._warned:
                log.warning("cannot write the progress file %s (%s): `status` shows older counts", self.path, exc)
                self._warned = True


@contextlib.contextmanager
def publishing(progress: ShardProgress, counts: Callable[[], dict]):
    """Publish a running client's `counts()` from a thread of its own every `interval_s`."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(progress.interval_s):
            progress.update(counts())

    progress.update(counts(), force=True)
    thread = threading.Thread(target=run, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        progress.update(counts(), force=True)


def lock_held(journal: str | Path) -> bool:
    """Whether a live job holds the shard's lock, tested without taking it (`F_GETLK`; ask from another
    process than the holder's: its own locks do not count)."""
    path = ShardLock(journal).path
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (and padding), as the platform lays it out.
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        return struct.unpack("hhqqi4x", answer)[0] != fcntl.F_UNLCK
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.EINVAL):
            return False
        raise
    finally:
        os.close(fd)


@dataclass
class Tail:
    """The journal's whole lines past an offset: rows finished since the progress file was written."""

    done: int = 0
    failed: int = 0
    output_tokens: int = 0
    end: int = 0  # the offset after the last whole line
    modified: float | None = None  # the journal's mtime: when its last line was written


def tail(journal: str | Path, offset: int) -> Tail:
    """Count the entries of `journal` from byte `offset` (a torn last line is left for later)."""
    found = Tail(end=offset)
    with contextlib.suppress(FileNotFoundError), open(journal, "rb") as fh:
        found.modified = os.fstat(fh.fileno()).st_mtime
        fh.seek(offset)
        for line in fh:
            if not line.endswith(b"\n"):
                break
            found.end += len(line)
            try:
                entry = orjson.loads(line)
            except ValueError:
                continue
            found.done += 1
            found.failed += entry.get("status") != "ok"
            found.output_tokens += len(entry.get("output_ids") or ())
    return found


@dataclass
class ShardView:
    """One shard as `status` shows it."""

    state: str  # running | starting | done | failed | killed | not started
    planned: int = 0
    done: int = 0
    failed: int = 0
    retries: int = 0
    output_tokens: int | None = 0  # None: not known (a table made before progress files)
    requests_per_s: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    limit: int | None = None
    in_flight: int | None = None
    host: str | None = None
    pid: int | None = None
    slurm_job_id: str | None = None
    updated: float | None = None
    error: str | None = None
    facts: dict = field(default_factory=dict, repr=False)


def read_progress(journal: str | Path) -> dict | None:
    try:
        return json.loads(progress_path(journal).read_bytes())
    except (FileNotFoundError, ValueError):  # none yet, or an older writer's torn file
        return None


def view(journal: str | Path, facts: dict, *, now: float | None = None, held: bool | None = None) -> ShardView:
    """The shard a progress file (`facts`) describes, with the journal's lines since and the lock's word."""
    now = time.time() if now is None else now
    held = lock_held(journal) if held is None and facts["state"] in RUNNING else bool(held)
    sent = facts["sent"]
    since = tail(journal, facts["journal_bytes"]) if facts["state"] in RUNNING else Tail()
    done = sent["done"] + since.done
    tokens = sent["output_tokens"] + since.output_tokens
    state = facts["state"]
    if state in RUNNING and not held:
        state = "killed"
    shard = ShardView(
        state=state,
        planned=facts["planned"],
        done=facts["reused"] + done,
        failed=sent["failed"] + since.failed,
        retries=sent["retries"],
        output_tokens=facts.get("reused_output_tokens", 0) + tokens,
        limit=sent.get("limit"),
        in_flight=sent.get("in_flight") if state in RUNNING else 0,
        host=facts.get("host"),
        pid=facts.get("pid"),
        slurm_job_id=facts.get("slurm_job_id"),
        updated=max(facts["updated"], since.modified or 0) if since.done else facts["updated"],
        error=facts.get("error"),
        facts=facts,
    )
    if state == "done":
        shard.planned = shard.done  # conversations that ended early send no more turns
    if state == "sending":
        samples = [*facts["samples"], [shard.updated, done, tokens]]
        shard.requests_per_s, shard.tokens_per_s = recent_rate(samples, now)
        if shard.requests_per_s:
            shard.eta_s = max(shard.planned - shard.done, 0) / shard.requests_per_s
    return shard


def recent_rate(samples: list, now: float, window_s: float = RATE_WINDOW_S) -> tuple[float | None, float | None]:
    """Rows/s and tokens/s over the last `window_s` seconds of (time, rows, tokens) samples, up to `now`."""
    last = samples[-1]
    first = next((s for s in samples if s[0] >= now - window_s), last)
    if first is last:
        first = samples[-2] if len(samples) > 1 else last
    span = now - first[0]
    if span <= 0:
        return None, None
    return (last[1] - first[1]) / span, (last[2] - first[2]) / span
