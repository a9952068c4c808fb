"""The real SGLang 0.5.23 server on CPU, for the real-SGLang tier (tests marked `real_sglang`).

`real_server(model_dir, log_path, ...)` starts `python -m sglang.launch_server` from the server's own
interpreter (installed by tests/sglang_server.py, before the suite) with the CPU environment and
flags, waits for `/health` while watching the process, and stops its whole process group (the HTTP
server, the scheduler and the detokenizer) on exit. `descendants(pid)` lists the process tree below
a job, to prove that none of a server's processes is left behind.
"""

import os
import signal
import subprocess
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import sglang_server
from polling import wait_until

# A loaded 2-core machine: SGLang measured 63 s for a first start and up to 119 s for later ones.
STARTUP_TIMEOUT_S = 600


def server_python() -> str:
    return str(sglang_server.installed())


def launch_args(model_dir: Path, *, context_length: int = 2048, max_total_tokens: int | None = 8192) -> list[str]:
    """The model and CPU flags of a launch (without python, host or port)."""
    args = ["--model-path", str(model_dir), *sglang_server.CPU_ARGS, "--context-length", str(context_length)]
    return args + (["--max-total-tokens", str(max_total_tokens)] if max_total_tokens else [])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def free_port() -> int:
    from eagle3_datagen.generation.servers import free_port as free

    return free()


@contextmanager
def real_server(model_dir: Path, log_path: Path, *, extra: list[str] = (), **launch):
    """Yield the base URL of a healthy real SGLang server serving `model_dir`; stopped on exit."""
    port = free_port()
    cmd = [server_python(), "-m", "sglang.launch_server", *launch_args(model_dir, **launch), *extra]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, **sglang_server.CPU_ENV}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: healthy(url),
            f"the real SGLang server to be healthy (log: {log_path})",
            timeout_s=STARTUP_TIMEOUT_S,
            process=proc,
        )
        yield url
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen, grace_s: float = 60) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def descendants(pid: int) -> dict[int, str]:
    """The live processes below `pid` (children, theirs, ...), each with its command line. SGLang
    renames its scheduler and detokenizer (`sglang::scheduler`), so only the tree finds them all."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) and stat[1] != "Z":
            parents[int(entry)] = stat[0]
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                except OSError:
                    continue
                frontier.append(child)
    return found


def alive(pids) -> list[int]:
    return [pid for pid in pids if (stat := _stat(pid)) and stat[1] != "Z"]
