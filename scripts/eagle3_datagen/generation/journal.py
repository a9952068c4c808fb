"""Append-only journal of finished requests: a killed generate job resumes where it stopped.

One JSON line per finished row, keyed by (id, sample_index, turn, mode), the last entry winning; fsync'd
in batches (a kill loses at most the unsynced tail, requested again; a torn last line is cut on opening).
It doubles as the generation cache: an ok entry is reused for any row of the same request fingerprint.
It keeps only where each line lies, so a job's memory does not grow with its answers.

A full disk loses nothing (docs/slurm.md): a write that fails cuts the file back to where its line began
and stops the journal with a `DiskFull`; a failed fsync cuts back to the last good one (the kernel may
have dropped any page written since), and the rerun requests those entries again.
"""

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import orjson

from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.quality.loops import LoopSettings, find_loop
from eagle3_datagen.settings import DEFAULT_MODE
from eagle3_datagen.storage.disk import DiskFull, disk_full, is_full

log = logging.getLogger(__name__)

# Where a line lies: (file number, byte offset, length without the newline).
Ref = tuple[int, int, int]

# What a full disk's message tells the user to do ({mount}: where the journal lies).
ADVICE = (
    "free space on {mount} or point cache_dir at a disk with room (moving its journal/ there), then rerun: "
    "every journalled row is kept and none is sent again"
)


def loop_rows(live_loop: LoopSettings | None) -> Callable[[dict], bool]:
    """Which ok entries may be reused (`Journal.reuse`): a loop the client stopped only while loops are
    stopped live (`live_loop`: the current settings, or None) and still found in its ids."""
    return lambda entry: (
        entry.get("finish_type") != LOOP_FINISH
        or (live_loop is not None and find_loop(entry.get("output_ids") or [], live_loop) is not None)
    )


def entry_key(entry: dict) -> tuple[str, int, int, str]:
    """(id, sample_index, turn, mode) of an entry; an entry may leave out turn 0 and the default mode."""
    return (entry["id"], int(entry["sample_index"]), int(entry.get("turn", 0)), entry.get("mode", DEFAULT_MODE))


class Journal:
    def __init__(
        self,
        path: str | Path,
        *,
        sync_every: int = 64,
        sync_interval_s: float = 2.0,
        read_only: bool = False,
        also_read=(),
    ):
        """`also_read`: other journals of the category whose ok entries are reused; only `path` is written."""
        self.path, self.read_only = Path(path), read_only
        self.sync_every, self.sync_interval_s = sync_every, sync_interval_s
        self._files: list[Path] = [self.path]
        self._fds: dict[int, int] = {}
        self._keys: dict[tuple, Ref] = {}
        self._by_fingerprint: dict[str, Ref] = {}
        self.torn_bytes = 0
        self._lines = 0  # whole lines in our own file (for the mean entry size)
        for other in also_read:
            if Path(other) != self.path:
                self._files.append(Path(other))
                for fingerprint, ref in self._load(len(self._files) - 1).items():
                    self._by_fingerprint.setdefault(fingerprint, ref)
        self._by_fingerprint.update(self._load(0))
        self._fd = None if read_only else self._open()
        self._size = self._synced_size = os.fstat(self._fd).st_size if self._fd is not None else 0
        self._synced_lines = self._lines
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self._lock = threading.Lock()  # the file's size and the index: appends and a failed fsync
        self._sync_lock = threading.Lock()  # held through an fsync; the descriptor closes only outside one
        self.stopped: OSError | None = None  # the failure after which no entry is taken
        self.reuse: Callable[[dict], bool] | None = None  # which ok entries `reusable` gives (`loop_rows`)
        # Rows still to journal (optional): a full disk's message then says the space they need.
        self.remaining_rows: int | None = None

    def _open(self) -> int:
        """The descriptor lines are appended through (the file and its folder made where missing)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        except OSError as exc:
            if is_full(exc):
                raise disk_full(exc, self.path, what="journal", advice=ADVICE) from exc
            raise

    def _load(self, file_no: int) -> dict[str, Ref]:
        """Index one journal file (our own by key too, its torn tail cut): its ok entries by fingerprint."""
        path, by_fingerprint = self._files[file_no], {}
        if not path.exists():
            return by_fingerprint
        good_end = pos = 0
        with open(path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # no newline: the last write was cut short
                try:
                    entry = orjson.loads(line)
                    key = entry_key(entry)
                except (ValueError, KeyError, TypeError):
                    log.warning("journal %s: unreadable entry at byte %d; ignoring the rest", path, pos)
                    break
                ref = (file_no, pos, len(line) - 1)
                if file_no == 0:
                    self._keys[key] = ref
                    self._lines += 1
                if entry.get("status") == "ok" and entry.get("fingerprint"):
                    by_fingerprint[entry["fingerprint"]] = ref
                pos = good_end = pos + len(line)
            size = fh.seek(0, os.SEEK_END)
        if good_end < size:
            self.torn_bytes = size - good_end
            if file_no == 0 and not self.read_only:
                log.warning("journal %s: cutting a torn tail of %d bytes", path, self.torn_bytes)
                with open(path, "r+b") as fh:
                    fh.truncate(good_end)
        return by_fingerprint

    def _read(self, ref: Ref) -> dict:
        file_no, offset, length = ref
        fd = self._fds.get(file_no)
        if fd is None:
            fd = self._fds[file_no] = os.open(self._files[file_no], os.O_RDONLY)
        return orjson.loads(os.pread(fd, length, offset))

    def reusable(self, fingerprint: str) -> dict | None:
        """A journalled ok result made by exactly this request, if there is one (and `reuse` takes it)."""
        ref = self._by_fingerprint.get(fingerprint)
        if ref is None:
            return None
        entry = self._read(ref)
        return entry if self.reuse is None or self.reuse(entry) else None

    def entry(self, key: tuple) -> dict | None:
        """The last entry for (id, sample_index, turn, mode), if any (a shorter key: turn 0, the default mode)."""
        key = (*key, 0, DEFAULT_MODE)[:4] if len(key) == 2 else (*key, DEFAULT_MODE)[:4]
        ref = self._keys.get(key)
        return None if ref is None else self._read(ref)

    def append(self, entry: dict) -> None:
        """Journal one entry: written whole, or not at all and the journal stopped (`DiskFull` if full)."""
        line = orjson.dumps(entry) + b"\n"
        with self._lock:
            if self.stopped is not None:
                why = f"journal {self.path} takes no entry after its failed write: {self.stopped}"
                if isinstance(self.stopped, DiskFull):
                    raise DiskFull(self.stopped.errno, why, self.path)
                raise OSError(self.stopped.errno, why)
            try:
                view = memoryview(line)
                while view:  # a short write: a nearly full disk takes part of it
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:
                self._stop(exc, self._size, self._lines, unwritten=len(line), cut=0)
            ref = (0, self._size, len(line) - 1)
            self._size += len(line)
            self._lines += 1
            self._keys[entry_key(entry)] = ref
            if entry.get("status") == "ok" and entry.get("fingerprint"):
                self._by_fingerprint[entry["fingerprint"]] = ref
            self._unsynced += 1
            if self.remaining_rows:
                self.remaining_rows -= 1

    def _stop(self, exc: OSError, size: int, lines: int, *, unwritten: int, cut: int) -> NoReturn:
        """Cut the file back to `size` bytes (`lines` lines), forget the `cut` entries past it, take no
        more, and raise `DiskFull` or `exc` itself (called holding `_lock`)."""
        try:
            os.ftruncate(self._fd, size)
        except OSError as trunc:  # a reopen cuts a torn tail as well: nothing after it is written
            log.error("journal %s: could not cut it back to %d bytes: %s", self.path, size, trunc)
        if cut:
            self._keys = {k: r for k, r in self._keys.items() if r[0] or r[1] < size}
            self._by_fingerprint = {f: r for f, r in self._by_fingerprint.items() if r[0] or r[1] < size}
        self._size, self._lines = size, lines
        if not is_full(exc):
            self.stopped = exc
            raise exc
        needed = None
        if self.remaining_rows is not None:
            mean = size / lines if lines else unwritten
            needed = round((self.remaining_rows + cut) * mean)
        lost = f" (the {cut} entries written after the last good fsync may not be on disk: they were cut,"
        advice = ADVICE + (f"{lost} and are sent again)" if cut else "")
        self.stopped = disk_full(exc, self.path, what="journal", unwritten=unwritten, needed=needed, advice=advice)
        raise self.stopped from exc

    def sync_due(self) -> bool:
        """Time for an fsync (the caller syncs, so that an event loop can do it off its thread)."""
        return bool(self._unsynced) and (
            self._unsynced >= self.sync_every or time.monotonic() - self._last_sync >= self.sync_interval_s
        )

    def sync(self) -> None:
        """fsync what is appended; one that fails cuts the journal back to the last good fsync and stops it."""
        with self._sync_lock:
            with self._lock:
                pending, size, lines = self._unsynced, self._size, self._lines
            if pending and self._fd is not None:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    with self._lock:  # the cut takes the entries appended during the fsync too
                        cut, unwritten = self._lines - self._synced_lines, self._size - self._synced_size
                        self._unsynced = 0
                        self._stop(exc, self._synced_size, self._synced_lines, unwritten=unwritten, cut=cut)
                with self._lock:
                    self._unsynced -= pending  # entries appended during the fsync wait for the next one
                    self._synced_size, self._synced_lines = size, lines
            self._last_sync = time.monotonic()

    def close(self) -> None:
        try:
            if self._fd is not None:
                self.sync()
        finally:
            with self._sync_lock:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
