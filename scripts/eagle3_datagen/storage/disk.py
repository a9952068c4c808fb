"""A full disk, said plainly (`DiskFull`), and files written whole or not at all (`WholeFile`).

Imports nothing of the package.
"""

import errno
import hashlib
import os
from contextlib import contextmanager, suppress
from pathlib import Path


class DiskFull(OSError):
    """A write stopped by a full disk (ENOSPC) or a spent quota (EDQUOT); `path` is the file it was for.
    An `OSError` with the original errno, so code that handles OSErrors still does."""

    def __init__(self, code: int, message: str, path: str | Path | None = None):
        super().__init__(code, message)
        self.path = None if path is None else Path(path)

    def __str__(self) -> str:
        return self.strerror


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def mount_of(path: str | Path) -> Path:
    """The mount point of the filesystem that holds (or would hold) `path`."""
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path):  # a path that does not exist is no mount point either
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged user may still write on the filesystem of `path` (None: unknown)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:  # a directory quota counts where the path would be
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def size_text(n: int) -> str:
    """`n` bytes, exactly and at a glance: "1523456 bytes (1.5 MB)"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n} bytes ({n / scale:.1f} {unit})"
    return f"{n} bytes"


DEFAULT_ADVICE = "free space on {mount}, then rerun"


def disk_full(
    exc: OSError,
    path: str | Path,
    *,
    what: str = "file",
    unwritten: int | None = None,
    needed: int | None = None,
    advice: str = DEFAULT_ADVICE,
) -> DiskFull:
    """The `DiskFull` of `exc` met while writing `path`: its message names the file (`what`: "journal",
    "table"), the bytes that did not fit (`unwritten`), those still free on the filesystem, about how much
    the rest of the work needs (`needed`), and what to do (`advice`, {mount} filled in)."""
    mount = mount_of(path)
    cause = "the disk quota is exceeded (EDQUOT)" if exc.errno == errno.EDQUOT else "the disk is full (ENOSPC)"
    parts = [f"{what} {path}: {cause}"]
    if unwritten is not None:
        parts.append(f"{size_text(unwritten)} did not fit")
    free = free_bytes(path)
    if free is not None:
        quota = ", a quota may allow less" if exc.errno == errno.EDQUOT else ""
        parts.append(f"{size_text(free)} free on {mount}{quota}")
    if needed is not None:
        parts.append(f"the rest of the work needs about {size_text(needed)} more")
    todo = advice.format(mount=mount)
    return DiskFull(exc.errno, f"{'; '.join(parts)}. {todo[:1].upper()}{todo[1:]}.", path)


class WholeFile:
    """A file written to `<path>.tmp` (by `_handle`) and renamed to `path` when closed whole. On any
    exception (a full disk: a `DiskFull` naming `path`) the temp file goes and `path` stays as it was."""

    what = "file"
    advice = DEFAULT_ADVICE

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.closed = False
        self._handle = None

    @contextmanager
    def guarded(self):
        try:
            yield
        except DiskFull:
            raise  # already discarded, by a write within this one
        except OSError as exc:
            self.discard()
            if not is_full(exc):
                raise
            raise disk_full(exc, self.path, what=self.what, advice=self.advice) from exc

    def close(self) -> None:
        """Write what is buffered and put the file in place."""
        with self.guarded():
            self._handle.close()
            os.replace(self.tmp, self.path)
        self.closed = True

    def discard(self) -> None:
        """Remove the temp file; `path` stays as it was."""
        if self._handle is not None:
            with suppress(OSError):  # a tail or footer that cannot be written is not wanted either
                self._handle.close()
        self.tmp.unlink(missing_ok=True)
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.closed:
            self.close() if exc_type is None else self.discard()


class AtomicFile(WholeFile):
    """Bytes written whole or not at all (`WholeFile`); `what` names the file in a `DiskFull`."""

    def __init__(self, path: str | Path, what: str = "file"):
        super().__init__(path)
        self.what = what
        with self.guarded():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.tmp, "wb")

    def write(self, data: bytes) -> None:
        with self.guarded():
            self._handle.write(data)


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
