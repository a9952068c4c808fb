"""Run a server so that it never outlives the job that started it.

`python -m eagle3_datagen.generation.watchdog --parent PID -- CMD ...` runs CMD in the watchdog's process group
(the job starts the watchdog as a session leader) and watches PID. When PID is gone — the
job was killed, even with SIGKILL — the whole group gets SIGTERM, then SIGKILL. SIGTERM to the
watchdog is passed on to the group the same way. When CMD exits by itself, what it started and left
in the group is stopped the same way. It exits with CMD's exit code, 127 when CMD cannot be run.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from eagle3_datagen.generation.startup import group_members

GRACE_S = 30.0


def watched(cmd: list[str]) -> list[str]:
    """`cmd` run under the watchdog of this process."""
    return [sys.executable, "-m", "eagle3_datagen.generation.watchdog", "--parent", str(os.getpid()), "--", *cmd]


def package_env(env: dict) -> dict:
    """`env` with this package first on PYTHONPATH, so that the watchdog can run wherever the job runs."""
    src = str(Path(__file__).resolve().parents[2])
    return env | {"PYTHONPATH": src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")}


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    pgid = os.getpgid(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal reaches us too
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    # The server and what it spawned (e.g. worker processes holding GPUs) get the grace together.
    while (proc.poll() is None or group_members(pgid, exclude=os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    for pid in group_members(pgid, exclude=os.getpid()):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parent", type=int, required=True, help="pid whose death stops the server")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given")
    terminating = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: terminating.append(signum))
    try:
        proc = subprocess.Popen(cmd)
    except OSError as exc:  # a shell's codes for a program it cannot find, or cannot run
        print(f"watchdog: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    while True:
        code = proc.poll()
        if code is not None:
            if group_members(os.getpgid(0), exclude=os.getpid()):  # what the server left behind
                stop_group(proc, grace_s=10.0)
            return code
        if terminating or os.getppid() != args.parent:  # reparented: the job is gone
            if not terminating:
                print(f"watchdog: parent {args.parent} is gone; stopping the server", file=sys.stderr, flush=True)
            stop_group(proc)
            return proc.wait()
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
