"""Start a generation server, wait until it is healthy, and make sure it never outlives its job.

One code path for every engine that launches a process (`local` now, `sglang` on GPU nodes): the
server runs in its own process group with its own log; start-up watches both the process and
`GET /health`; stopping sends SIGTERM to the group, then SIGKILL. Failure is detected from the
process state and HTTP status, never by matching log text.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# Launch flags that would change or cut the data: parsers rewrite tokens on the chat layer (and a
# server for this pipeline needs none), auto-truncation silently cuts prompts, and without the
# tokenizer the server cannot check what it is given.
REFUSED_SGLANG_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--allow-auto-truncate", "--skip-tokenizer-init")
SECRET_FLAGS = ("--api-key",)


def check_extra_args(args: list[str]) -> None:
    """Refuse launch arguments that would reshape or cut the generated data."""
    bad = [a for a in args if a.split("=", 1)[0] in REFUSED_SGLANG_FLAGS]
    if bad:
        raise ValueError(f"engine.sglang.extra_args: {', '.join(bad)} would reshape or cut the generated data; remove it")


def sglang_command(engine: dict, *, port: int, context_length: int, api_key: str | None = None) -> list[str]:
    """`python -m sglang.launch_server ...` from the config, bound to localhost on `port`."""
    sglang = engine["sglang"]
    extra = [str(a) for a in sglang.get("extra_args") or []]
    check_extra_args(extra)
    cmd = [
        sglang.get("python", "python"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(sglang["model_path"]),
        "--tp-size",
        str(sglang.get("tp_size", 1)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        str(context_length),
    ]
    if sglang.get("trust_remote_code"):
        cmd.append("--trust-remote-code")
    if sglang.get("mem_fraction_static") is not None:
        cmd += ["--mem-fraction-static", str(sglang["mem_fraction_static"])]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + extra


def redacted(cmd: list[str]) -> str:
    """A command line fit for a log: the values of secret flags hidden."""
    out = []
    hide = False
    for arg in cmd:
        if hide:
            out.append("***")
            hide = False
            continue
        name = arg.split("=", 1)[0]
        if name in SECRET_FLAGS:
            if "=" in arg:
                out.append(f"{name}=***")
            else:
                out.append(arg)
                hide = True
            continue
        out.append(arg)
    return " ".join(out)


def local_engine_command(engine: dict, *, port: int, context_length: int, tokenizer: str, record: str | None) -> list[str]:
    """The command line of the CPU stand-in engine (python -m eagle3_datagen.engine)."""
    local = engine["local"]
    cmd = [
        sys.executable,
        "-m",
        "eagle3_datagen.engine",
        "--backend",
        local["backend"],
        "--model-dir",
        str(local.get("model_dir") or tokenizer),
        "--tokenizer-dir",
        str(tokenizer),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        str(context_length),
        "--max-batch",
        str(local.get("max_batch", 16)),
    ]
    if record:
        cmd += ["--record", str(record)]
    for flag, key in (("--latency-ms", "latency_ms"), ("--error-rate", "error_rate"), ("--reset-rate", "reset_rate"), ("--hang-rate", "hang_rate"), ("--fail-rids", "fail_rids"), ("--seed", "seed"), ("--die-after", "die_after")):
        if local.get(key) not in (None, ""):
            cmd += [flag, str(local[key])]
    for flag, key in (("--fail-startup", "fail_startup"), ("--never-healthy", "never_healthy")):
        if local.get(key):
            cmd.append(flag)
    return cmd


class ManagedServer:
    """A server process owned by this job: `with ManagedServer(...) as url:`."""

    def __init__(self, cmd: list[str], *, port: int, log_path: str | Path, startup_timeout_s: float = 600.0, env: dict | None = None):
        self.cmd = cmd
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        src = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        log.info("starting server: %s (log: %s)", redacted(self.cmd), self.log_path)
        # The watchdog runs the server in a process group of its own and takes the whole group down
        # when this process dies, even by SIGKILL: no server outlives its job.
        watched = [sys.executable, "-m", "eagle3_datagen.watchdog", "--parent", str(os.getpid()), "--"] + self.cmd
        self.proc = subprocess.Popen(watched, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self._wait_healthy()
        return self.url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.1
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"the server exited with code {code} during start-up; its log is {self.log_path}:\n{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        log.info("server healthy at %s after pid %d start", self.url, self.proc.pid)
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"the server did not become healthy within {self.startup_timeout_s:.0f} s; its log is "
                    f"{self.log_path}:\n{log_tail(self.log_path)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("server pid %d ignored SIGTERM for %.0f s; killing it", self.proc.pid, grace_s)
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._log.close()
        log.info("server stopped (exit code %s)", self.proc.returncode)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
