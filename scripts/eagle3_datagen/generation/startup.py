"""What stops a launched server before it serves, and the one message a job ends with then.

Before launching: too few GPUs (`check_gpus`), a missing model path (`check_model_path`), a port
the user fixed that is taken (`user_port`). While it starts: who listens on its port (`port_owner`).
When it fails: the cause, from its exit code, named more closely by the log's last lines (`cause`).
Control flow follows process state, ports and HTTP status; the log's text only names a cause.
"""

import os
import re
import signal
import socket
from contextlib import suppress
from itertools import takewhile
from pathlib import Path

from eagle3_datagen.engine_settings import SGLangServer, flag_value


class ServerError(RuntimeError):
    """A launched server that did not start or died: the one message a job ends with."""


def log_tail(path: Path, lines: int = 30, width: int = 400) -> str:
    """The log's last lines, each cut at `width` characters (SGLang logs all its arguments on one line).
    Only the file's end is read: a server's log after a long run may be large."""
    try:
        with open(path, "rb") as fh:
            start = max(fh.seek(0, os.SEEK_END) - lines * (width + 100), 0)
            fh.seek(start)
            text = fh.read().decode(errors="replace").splitlines()[1 if start else 0 :]
    except OSError:
        return "(no log)"
    return "\n".join(line if len(line) <= width else line[:width] + " [...]" for line in text[-lines:])


# SLURM's record of the GPUs it gave a job, shown when the job sees fewer than it needs.
SLURM_GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GRES")


def user_port(extra_args: list[str]) -> int | None:
    """The port `engine.sglang.extra_args` fixes with `--port`, if it does (the launcher's otherwise)."""
    value = flag_value(extra_args, "port")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"engine.sglang.extra_args: --port {value!r} is not a port number") from None


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `port` now (as uvicorn binds: SO_REUSEADDR, so only a listener blocks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def visible_gpus(environ, dev: Path = Path("/dev")) -> tuple[int | None, str]:
    """How many NVIDIA GPUs a process started here can use, and what says so; None where it cannot
    tell (an AMD node: ROCm's devices are not counted here)."""
    files = sorted(p.name for p in dev.glob("nvidia[0-9]*"))
    where = f"{len(files)} NVIDIA device files in {dev} ({', '.join(files)})" if files else f"no {dev}/nvidia* devices"
    if not files and (dev / "kfd").exists():
        return None, f"{where}, but {dev}/kfd (ROCm)"
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(files), where
    # CUDA stops at the first entry that names no device: "-1" (or SLURM's NoDevFiles) hides the rest.
    count = len(list(takewhile(lambda entry: entry.strip() not in ("", "-1", "NoDevFiles"), visible.split(","))))
    return (min(count, len(files)) if files else 0), f"CUDA_VISIBLE_DEVICES={visible!r}, {where}"


def check_gpus(sglang: SGLangServer, environ=os.environ, dev: Path = Path("/dev")) -> None:
    """Refuse, before launching, an SGLang server that needs more GPUs than the job sees. A server
    told to run elsewhere (`--device cpu`, or any device but cuda) is not counted."""
    device = flag_value(list(sglang.extra_args), "device")
    if device not in (None, "cuda"):
        return
    needed = sglang.gpus  # on this node
    seen, where = visible_gpus(environ, dev)
    if seen is None or seen >= needed:
        return
    slurm = [f"{name}={environ[name]}" for name in SLURM_GPU_VARIABLES if environ.get(name)]
    if slurm:
        asked = "SLURM gave it " + ", ".join(slurm)
    elif environ.get("SLURM_JOB_ID"):
        asked = (
            f"SLURM job {environ['SLURM_JOB_ID']} was given no GPUs (none of {', '.join(SLURM_GPU_VARIABLES)} is set)"
        )
    else:
        asked = "it is not a SLURM job"
    raise RuntimeError(
        f"{sglang.parallel_sizes} needs {needed} GPU{'s' * (needed != 1)} on this node, but this "
        f"job sees {seen} ({where}); {asked}. Run it on a GPU node with that many GPUs (the cluster profile's "
        "generate resources), or, for a CPU server, pass --device cpu in engine.sglang.extra_args"
    )


def check_model_path(sglang: SGLangServer) -> None:
    """Refuse, before launching, a `model_path` shaped as a local path (not a hub id: absolute, or
    starting with ., ..  or ~) that does not exist: the server would find out only once imported."""
    path = sglang.model_path
    if path.startswith(("/", "./", "../", "~")) and not Path(path).expanduser().exists():
        raise RuntimeError(f"engine.sglang.model_path {path} does not exist (on {socket.gethostname()})")


def _listening_inodes(port: int) -> set[int] | None:
    """The socket inodes listening on TCP `port`; None where /proc/net cannot be read (not Linux)."""
    inodes, read = set(), False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes if read else None


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """The live processes of process group `pgid`, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        with suppress(OSError):  # a process gone, or one this user may not read
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with suppress(OSError):
                    if (target := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


def port_owner(port: int, pgid: int) -> str | None:
    """Who listens on `port`: "ours" (a process of the server's group `pgid`), "other" (only another
    process), or None (nobody, or it cannot be told here)."""
    listening = _listening_inodes(port)
    if not listening:
        return None
    return "ours" if listening & _socket_inodes(group_members(pgid)) else "other"


def exit_text(code: int) -> str:
    """An exit code in words; through the watchdog a server killed by signal N exits 256 - N."""
    for number in (-code, 256 - code, code - 128):
        if number in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            return f"code {code}: killed by {signal.Signals(number).name}"
    return f"code {code}"


# Causes the log's last lines can show, to name them (never to decide what to do): a pattern, and
# what it means for the config key the user edits ({python}, {model_path} filled in).
KNOWN_CAUSES = (
    (
        r"No module named '?sglang",
        "engine.sglang.python {python} is not SGLang's interpreter: it has no sglang module",
    ),
    (
        r"does not appear to have a file named config\.json|Unrecognized model in|Repo id must be in the form"
        r"|is not a local folder and is not a valid model identifier|Can't load the configuration",
        "engine.sglang.model_path {model_path} is not a model SGLang can load (a directory with its config.json, "
        "or a hub id)",
    ),
    (
        r"couldn't connect to 'https://huggingface\.co'",
        "engine.sglang.model_path {model_path} is no local directory, and as a hub id it is neither in the "
        "cache (HF_HOME) nor downloadable from here",
    ),
    (r"[Aa]ddress already in use", "its port was in use"),
    (r"CUDA out of memory|OutOfMemoryError", "the GPU ran out of memory (engine.sglang.mem_fraction_static)"),
    (
        r"No accelerator .* is available|Found no NVIDIA driver|No CUDA GPUs are available",
        "it found no GPU (pass --device cpu in engine.sglang.extra_args for a CPU server)",
    ),
    (
        r"exit code: -9",
        "one of its processes was killed by SIGKILL: the kernel's OOM killer does this (engine.job.mem_mb)",
    ),
    (
        r"\berror: (unrecognized arguments|argument|the following arguments)",
        "it refused its command line (engine.sglang.extra_args)",
    ),
)


def cause(code: int, tail: str, *, python: str = "", model_path: str = "") -> str:
    """Why a server exited during start-up with `code`: the known cause its log's `tail` shows (with
    the line that shows it), else its last error line."""
    if code == 127:  # the watchdog's exit when the server's program cannot be run (a shell's too)
        return f"engine.sglang.python {python} cannot be run: no such program"
    lines = tail.splitlines()
    for pattern, meaning in KNOWN_CAUSES:
        found = next((line.strip() for line in reversed(lines) if re.search(pattern, line)), None)
        if found is not None:
            return f"{meaning.format(python=python, model_path=model_path)} (log: {found[:300]})"
    if "SIGKILL" in exit_text(code):
        return "it was killed by SIGKILL: the kernel's OOM killer does this when the job's memory runs out (engine.job.mem_mb)"
    return last_error(tail)


def last_error(tail: str) -> str:
    """The log's last error line ("ValueError: ..."), as the cause of an exit no known cause explains."""
    error = next(
        (line.strip() for line in reversed(tail.splitlines()) if re.match(r"\s*[\w.]*(Error|Exception)\b", line)), None
    )
    return f"its last error: {error[:300]}" if error else "its log names no error"
