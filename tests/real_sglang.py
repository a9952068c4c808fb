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
import threading
import urllib.request
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import sglang_server
from polling import wait_until

# A loaded 2-core machine: SGLang measured 63 s for a first start and up to 119 s for later ones.
STARTUP_TIMEOUT_S = 600


def server_python() -> str:
    return str(sglang_server.installed())


def sglang_engine(model_dir, *, deterministic=False, extra=()) -> dict:
    """The config's `engine` block: each generate job launches the real server on CPU, its CPU
    settings passed as a cluster user passes theirs (`engine.sglang.env`, `extra_args`)."""
    return {
        "kind": "sglang",
        "deterministic_inference": deterministic,
        "startup_timeout_s": STARTUP_TIMEOUT_S,
        "job": {"cpus": 1, "mem_mb": 4000, "runtime": 60},
        "sglang": {
            "python": server_python(),
            "model_path": str(model_dir),
            "tp_size": 1,
            "env": dict(sglang_server.CPU_ENV),
            "extra_args": [*sglang_server.CPU_ARGS, *extra],
        },
    }


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


def processes_in(directory: Path) -> dict[int, str]:
    """The live processes (other than this one) working in `directory`, each with its command line:
    a run's Snakemake, the jobs SLURM runs for it there, and every server process they start."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if Path(os.readlink(f"/proc/{entry}/cwd")) != directory:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if (stat := _stat(int(entry))) and stat[1] != "Z":
            found[int(entry)] = cmdline
    return found


def launches_sglang(cmdlines: str) -> bool:
    return any(c.split()[1:3] == ["-m", "sglang.launch_server"] for c in cmdlines.split(" | "))


def sglang_servers(processes: dict[int, str], parents: dict[int, int] | None = None) -> dict[int, str]:
    """The SGLang servers among `processes` (pid: command lines): each process that ran
    `python -m sglang.launch_server` and whose parent did not. The server forks its scheduler and
    detokenizer with its own command line, and a watch may see them before they rename themselves.
    `parents` (pid: parent pid) as recorded while they lived; read from /proc when not given."""
    if parents is None:
        parents = {pid: stat[0] for pid in processes if (stat := _stat(pid))}
    launched = {pid for pid, cmd in processes.items() if launches_sglang(cmd)}
    return {pid: processes[pid] for pid in launched if parents.get(pid) not in launched}


class ProcessWatch:
    """Every process `find()` lists while a run goes on (polled from a thread), with every name it
    had: the job, the watchdog, the server and the processes the server starts, whatever they
    rename themselves to (SGLang renames its scheduler and detokenizer)."""

    def __init__(self, find: Callable[[], dict[int, str]]):
        self.find, self.seen, self.parents, self._stop = find, {}, {}, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            for pid, cmdline in self.find().items():
                self.seen.setdefault(pid, set()).add(cmdline)
                if pid not in self.parents and (stat := _stat(pid)):
                    self.parents[pid] = stat[0]
            self._stop.wait(0.2)

    def processes(self) -> dict[int, str]:
        return {pid: " | ".join(sorted(names)) for pid, names in list(self.seen.items())}

    def stop(self) -> dict[int, str]:
        self._stop.set()
        self._thread.join()
        return self.processes()

    def servers(self) -> dict[int, str]:
        """The SGLang servers seen (not the processes they forked)."""
        return sglang_servers(self.processes(), self.parents)


def greedy_exact(rows: list[dict], model_dir, stop_ids=(163586,)) -> Counter:
    """Assert that every ok row is transformers' own greedy decoding on the same weights, given the
    row's prompt ids (every attention position on: a prompt may hold the pad id), and that it ends
    as the server said: on one of `stop_ids` (kept), at its budget, or stopped live as a loop (a
    prefix of the greedy answer); the rows checked, by (later turn, tools, finish)."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagle3_datagen.quality.flags import LOOP_FINISH

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    checked = Counter()
    for row in (r for r in rows if r["status"] == "ok"):
        prompt, out = torch.tensor([list(row["prompt_ids"])]), list(row["output_ids"])
        with torch.no_grad():
            own = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=len(out),
                do_sample=False,
                eos_token_id=None,
            )[0, prompt.shape[1] :].tolist()
        where = f"{row['id']} turn {row['turn']}"
        assert own == out, f"{where}: SGLang's output differs from transformers' greedy continuation"
        if row["finish_type"] == "stop":
            assert out[-1] == int(row["finish_matched"]) and out[-1] in stop_ids, where
        elif row["finish_type"] == LOOP_FINISH:
            assert len(out) < row["max_new_tokens"], where
        else:
            assert row["finish_type"] == "length" and len(out) == row["max_new_tokens"], where
        checked[(row["turn"] > 0, bool(row["tools"]), row["finish_type"])] += 1
    return checked
