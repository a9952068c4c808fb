"""Run a server so that it never outlives the job that started it.

`python -m eagle3_datagen.generation.watchdog --parent PID -- CMD ...` runs CMD in the watchdog's process group
(the job starts the watchdog as a session leader) and watches PID. When PID is gone — the
job was killed, even with SIGKILL — the whole group gets SIGTERM, then SIGKILL. SIGTERM to the
watchdog is passed on to the group the same way. It exits with CMD's exit code.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

GRACE_S = 30.0


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    pgid = os.getpgid(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group signal reaches us too
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    # Anything the server spawned that is still in the group (e.g. worker processes holding GPUs).
    for pid in _group_members(pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _group_members(pgid: int) -> list[int]:
    """Other live processes of a process group, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parent", type=int, required=True, help="pid whose death stops the server")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given")
    terminating = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminating.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: terminating.append(signum))
    proc = subprocess.Popen(cmd)
    while True:
        code = proc.poll()
        if code is not None:
            return code
        if terminating or os.getppid() != args.parent:  # reparented: the job is gone
            if not terminating:
                print(f"watchdog: parent {args.parent} is gone; stopping the server", file=sys.stderr, flush=True)
            stop_group(proc)
            return proc.wait()
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
