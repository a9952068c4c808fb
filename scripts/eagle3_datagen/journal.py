"""Append-only journal of finished requests: a killed generate job resumes where it stopped.

One JSON line per finished row (ok or failed). Lines are flushed as they are written and fsync'd in
batches, so a kill loses at most the unsynced tail, and those rows are simply requested again —
never written twice, because the journal is keyed by (id, sample_index) and the last entry wins.
A torn last line (a kill mid-write) is cut off when the journal is opened.

The journal doubles as the generation cache: an ok entry is reused for any row whose request
fingerprint (model and server, prompt ids, sampling, budget, seed, sample index) is the same, so an
edited prompt is sent again and an unchanged one never is, whatever its file's timestamp says.
"""

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


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
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sync_every = sync_every
        self.sync_interval_s = sync_interval_s
        self.entries: dict[tuple[str, int], dict] = {}
        self.by_fingerprint: dict[str, dict] = {}
        self.torn_bytes = 0
        for other in also_read:
            if Path(other) != self.path:
                Journal(other, read_only=True)._merge_into(self)
        self._load()
        self._fh = None if read_only else open(self.path, "ab")
        self._unsynced = 0
        self._last_sync = time.monotonic()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            data = fh.read()
        good_end = 0
        pos = 0
        while pos < len(data):
            newline = data.find(b"\n", pos)
            if newline == -1:
                break  # no newline: the last write was cut short
            line = data[pos:newline]
            try:
                entry = json.loads(line)
                key = (entry["id"], int(entry["sample_index"]))
            except (ValueError, KeyError, TypeError):
                log.warning("journal %s: unreadable entry at byte %d; ignoring the rest", self.path, pos)
                break
            self._index(key, entry)
            pos = good_end = newline + 1
        if good_end < len(data):
            self.torn_bytes = len(data) - good_end
            if not self.read_only:
                log.warning("journal %s: cutting a torn tail of %d bytes", self.path, self.torn_bytes)
                with open(self.path, "r+b") as fh:
                    fh.truncate(good_end)

    def _merge_into(self, other: "Journal") -> None:
        for entry in self.by_fingerprint.values():
            other.by_fingerprint.setdefault(entry["fingerprint"], entry)

    def _index(self, key: tuple[str, int], entry: dict) -> None:
        self.entries[key] = entry
        if entry.get("status") == "ok" and entry.get("fingerprint"):
            self.by_fingerprint[entry["fingerprint"]] = entry

    def reusable(self, fingerprint: str) -> dict | None:
        """A journalled ok result made by exactly this request, if there is one."""
        return self.by_fingerprint.get(fingerprint)

    def append(self, entry: dict) -> None:
        self._index((entry["id"], int(entry["sample_index"])), entry)
        self._fh.write(json.dumps(entry, separators=(",", ":")).encode("utf-8") + b"\n")
        self._fh.flush()
        self._unsynced += 1

    def sync_due(self) -> bool:
        """Time for an fsync: after `sync_every` entries or `sync_interval_s` seconds (the caller
        syncs, so that an event loop can do it off its thread)."""
        return bool(self._unsynced) and (
            self._unsynced >= self.sync_every or time.monotonic() - self._last_sync >= self.sync_interval_s
        )

    def sync(self) -> None:
        if self._unsynced and self._fh is not None and not self._fh.closed:
            pending = self._unsynced
            os.fsync(self._fh.fileno())
            self._unsynced -= pending  # entries appended during the fsync wait for the next one
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fh is not None and not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
