"""Append-only journal of finished requests: a killed generate job resumes where it stopped.

One JSON line per finished row (ok or failed). Lines are flushed as they are written and fsync'd in
batches, so a kill loses at most the unsynced tail, and those rows are simply requested again —
never written twice, because the journal is keyed by (id, sample_index, turn, mode) and the last entry wins.
A torn last line (a kill mid-write) is cut off when the journal is opened.

The journal doubles as the generation cache: an ok entry is reused for any row whose request
fingerprint (model and server, prompt ids, sampling, budget, seed, sample index) is the same, so an
edited prompt is sent again and an unchanged one never is, whatever its file's timestamp says.

A row the client stopped as a loop (finish_type `loop`) is only a prefix of what the model would have
written: it is reused only while the current settings stop loops live and still find a loop in its
ids (`loop_rows`); else it is requested again.

Memory: the journal keeps only where each entry's line lies (file, offset, length), never the
entries themselves, and reads a line back when it is asked for; so a job's memory does not grow
with the answers it has journalled (tens of GB for 88k answers of 10k tokens).

A full disk (ENOSPC, EDQUOT) loses nothing. A line is written with `os.write` on a raw descriptor
(looping on short writes), so no byte of it waits in a buffer; a write that fails cuts the file back
to where the line began, so only whole lines remain, and the journal stops: it takes no entry after
a failure (a later one would follow a hole), and the failure is a `DiskFull` that names the journal,
the bytes that did not fit, the bytes free, and (given `remaining_rows`) the space the rest needs.
An fsync that fails is treated the same way, but the cut goes back to the size of the last good
fsync: after a failed writeback the kernel may have dropped any page written since, so nothing past
that point can be trusted to be on disk; those entries (at most `sync_every`, or `sync_interval_s`
of them) are requested again by the rerun, as after a kill. Every entry before the cut is whole and
durable, so the rerun sends none of them again. A stopped journal's index forgets the cut entries;
a reopen reads exactly what the file holds.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
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


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, looping on short writes (a nearly full disk takes part of a write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def loop_rows(live_loop: LoopSettings | None) -> Callable[[dict], bool]:
    """Which ok entries may be reused (`Journal.reuse`): any that did not stop as a loop; one that did,
    only while loops are stopped live (`live_loop`, the current loop settings; None: they are not) and
    `find_loop` still finds one in its ids."""

    def reusable(entry: dict) -> bool:
        if entry.get("finish_type") != LOOP_FINISH:
            return True
        return live_loop is not None and find_loop(entry.get("output_ids") or [], live_loop) is not None

    return reusable


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
        """`also_read`: other journals of the same category (other shards, earlier shard counts)
        whose ok entries are reused; only `path` is ever written or repaired."""
        self.path = Path(path)
        self.read_only = read_only
        self.sync_every = sync_every
        self.sync_interval_s = sync_interval_s
        self._files: list[Path] = [self.path]
        self._fds: dict[int, int] = {}
        self._keys: dict[tuple, Ref] = {}
        self._by_fingerprint: dict[str, Ref] = {}
        self.torn_bytes = 0
        self._lines = 0  # whole lines in our own file (for the mean entry size)
        for other in also_read:
            if Path(other) != self.path:
                self._files.append(Path(other))
                found: dict[str, Ref] = {}
                self._load(len(self._files) - 1, found)
                for fingerprint, ref in found.items():
                    self._by_fingerprint.setdefault(fingerprint, ref)
        self._load(0, self._by_fingerprint, keys=self._keys)
        self._fd = None if read_only else self._open()
        self._size = self._synced_size = os.fstat(self._fd).st_size if self._fd is not None else 0
        self._synced_lines = self._lines
        self._unsynced = 0
        self._last_sync = time.monotonic()
        self._lock = threading.Lock()  # the file's size and the index: appends and a failed fsync
        self._sync_lock = threading.Lock()  # held through an fsync; the descriptor closes only outside one
        self.stopped: OSError | None = None  # the failure after which no entry is taken
        self.reuse: Callable[[dict], bool] | None = None  # which ok entries `reusable` gives (`loop_rows`)
        # Rows the caller has still to journal (optional): a full disk's message then says how much
        # space the rest needs. Each append counts one down.
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

    def _load(self, file_no: int, by_fingerprint: dict, keys: dict | None = None) -> None:
        """Index one journal file a line at a time; cut a torn tail of our own file."""
        path = self._files[file_no]
        if not path.exists():
            return
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
                if keys is not None:
                    keys[key] = ref
                if entry.get("status") == "ok" and entry.get("fingerprint"):
                    by_fingerprint[entry["fingerprint"]] = ref
                self._lines += file_no == 0
                pos = good_end = pos + len(line)
            size = fh.seek(0, os.SEEK_END)
        if good_end < size:
            self.torn_bytes = size - good_end
            if file_no == 0 and not self.read_only:
                log.warning("journal %s: cutting a torn tail of %d bytes", path, self.torn_bytes)
                with open(path, "r+b") as fh:
                    fh.truncate(good_end)

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
        """The last entry this journal holds for (id, sample_index, turn, mode), if any (a shorter key:
        turn 0, the default mode)."""
        key = (*key, 0, DEFAULT_MODE)[:4] if len(key) == 2 else (*key, DEFAULT_MODE)[:4]
        ref = self._keys.get(key)
        return None if ref is None else self._read(ref)

    @property
    def entries(self) -> Mapping:
        """(id, sample_index, turn, mode) -> last entry, read from the file as it is looked at."""
        return _Entries(self)

    def append(self, entry: dict) -> None:
        """Journal one entry: written whole, or not at all and the journal stopped (`DiskFull` when
        the disk is full; the failure itself otherwise)."""
        line = orjson.dumps(entry) + b"\n"
        with self._lock:
            if self.stopped is not None:
                raise self._refusal()
            try:
                _write_all(self._fd, line)
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
        """Cut the file back to `size` bytes (`lines` whole lines), forget the `cut` entries past it,
        take no more entries, and raise: `DiskFull`, or `exc` itself (called holding `_lock`)."""
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
        lost = (
            f" (the {cut} entries written after the last good fsync may not be on disk: they were cut, "
            "and are sent again)"
            if cut
            else ""
        )
        self.stopped = disk_full(
            exc, self.path, what="journal", unwritten=unwritten, needed=needed, advice=ADVICE + lost
        )
        raise self.stopped from exc

    def _refusal(self) -> OSError:
        why = f"journal {self.path} takes no entry after its failed write: {self.stopped}"
        if isinstance(self.stopped, DiskFull):
            return DiskFull(self.stopped.errno, why, self.path)
        return OSError(self.stopped.errno, why)

    def sync_due(self) -> bool:
        """Time for an fsync: after `sync_every` entries or `sync_interval_s` seconds (the caller
        syncs, so that an event loop can do it off its thread)."""
        return bool(self._unsynced) and (
            self._unsynced >= self.sync_every or time.monotonic() - self._last_sync >= self.sync_interval_s
        )

    def sync(self) -> None:
        """fsync what is appended; one that fails cuts the journal back to the last good fsync
        and stops it (see the module docstring)."""
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


class _Entries(Mapping):
    def __init__(self, journal: Journal):
        self._journal = journal

    def __getitem__(self, key):
        entry = self._journal.entry(key)
        if entry is None:
            raise KeyError(key)
        return entry

    def __iter__(self) -> Iterator:
        return iter(self._journal._keys)

    def __len__(self) -> int:
        return len(self._journal._keys)
