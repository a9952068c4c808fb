"""One generate job per shard at a time: a lock on the shard's journal.

Two jobs sending one shard's rows (an orphan of a killed Snakemake and its resubmitted twin, another
user sharing `cache/`) would pay for every row twice and interleave their appends. So a generate job
holds `<journal>.lock` for its whole run, and a second one refuses at once, before it starts a
server, naming the holder (written into the lock file for that only).

The lock is a POSIX record lock (`fcntl.lockf`), which NFS, Lustre (mounted with `flock`) and GPFS
keep across nodes, and which dies with its holder, even a SIGKILLed one (on NFS when the server
notices: NFSv4's lease, 90 s by default), so no one has to remove a stale file.
"""

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import NoReturn

from eagle3_datagen.storage.disk import disk_full, is_full


class ShardBusy(RuntimeError):
    """Another live job holds the shard's journal."""


def describe(facts: dict) -> str:
    job = f", SLURM job {facts['slurm_job_id']}" if facts.get("slurm_job_id") else ""
    return f"host {facts.get('host')}, pid {facts.get('pid')}{job}, since {facts.get('since')}"


class ShardLock:
    def __init__(self, journal: str | Path):
        self.journal = Path(journal)
        self.path = self.journal.with_name(self.journal.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> "ShardLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._stop(exc)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            try:
                facts = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                facts = {}
            who = describe(facts) if facts else "a job that has not written its name yet"
            hint = f" (scancel {facts['slurm_job_id']})" if facts.get("slurm_job_id") else ""
            raise ShardBusy(
                f"another generate job holds the journal {self.journal}: {who}. Two jobs sending one shard's rows "
                f"would pay for each row twice, so this one stops before starting a server. Let the holder "
                f"finish (a rerun then sends nothing it journalled), or stop it{hint} and rerun; a holder that "
                "dies releases the lock by itself (docs/slurm.md: after a kill or preemption)."
            ) from None
        try:
            os.ftruncate(fd, 0)
            facts = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            os.write(fd, (json.dumps(facts) + "\n").encode())
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)  # and so the lock goes
            self._stop(exc)
        self._fd = fd
        return self

    def _stop(self, exc: OSError) -> NoReturn:
        """Raise a `DiskFull` naming the lock file for a full disk, `exc` itself otherwise."""
        if not is_full(exc):
            raise exc
        raise disk_full(
            exc,
            self.path,
            what="the lock file of the journal",
            advice="nothing was sent; free space on {mount} or point cache_dir at a disk with room, then rerun",
        ) from exc

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ShardLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
