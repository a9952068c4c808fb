"""The servers a generate job talks to: launched ones (`sglang`, `local`) or running ones (`external`).

One code path for every engine that launches a process: the server runs in its own process group
with its own log; start-up watches both the process and `GET /health`; stopping sends SIGTERM to the
group, then SIGKILL. Failure is detected from the process state and HTTP status, never by matching
log text (the command lines come from `launch`). Also here: the API key (from the environment,
never the config), SIGTERM handling, and the server facts recorded as provenance.
"""

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.generation.launch import local_engine_command, server_env, sglang_command
from eagle3_datagen.generation.redact import redact, redact_command
from eagle3_datagen.settings import ModelProfile

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


# Exit codes of a server stopped by SIGTERM: killed by the signal (-15), its shell convention
# (143 = 128 + 15), a Python sys.exit(-15) as the watchdog passes it on (241 = 256 - 15), or 0.
# SGLang 0.5.23 ends its own orderly SIGTERM shutdown by SIGKILLing itself (kill_process_tree with
# include_parent, srt/utils/common.py), so -9 (247 through the watchdog) is normal too when it came
# before this job's own SIGKILL.
STOPPED_BY_SIGTERM = {
    0,
    -signal.SIGTERM,
    128 + signal.SIGTERM,
    256 - signal.SIGTERM,
    -signal.SIGKILL,
    256 - signal.SIGKILL,
}


def stop_message(code: int | None, *, stopped_here: bool, killed_here: bool = False) -> str:
    """How a server's end reads in the log: a stop this job asked for is normal, whatever its code."""
    if not stopped_here:
        return f"the server had already exited by itself, with exit code {code}"
    if killed_here:
        return "server killed (SIGKILL) after it ignored SIGTERM"
    if code in STOPPED_BY_SIGTERM:
        return f"server stopped normally (SIGTERM from this job; exit code {code})"
    return f"server stopped after SIGTERM, with exit code {code}"


class ManagedServer:
    """A server process owned by this job: `with ManagedServer(...) as url:`."""

    def __init__(
        self,
        cmd: list[str],
        *,
        port: int,
        log_path: str | Path,
        startup_timeout_s: float = 600.0,
        env: dict | None = None,
    ):
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
        src = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        log.info("starting server: %s (log: %s)", redact_command(self.cmd), self.log_path)
        # The watchdog runs the server in a process group of its own and takes the whole group down
        # when this process dies, even by SIGKILL: no server outlives its job.
        watched = [
            sys.executable,
            "-m",
            "eagle3_datagen.generation.watchdog",
            "--parent",
            str(os.getpid()),
            "--",
        ] + self.cmd
        self.proc = subprocess.Popen(
            watched, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
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
        already, killed = self.proc.poll(), False
        if already is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                killed = True
                log.warning("server pid %d ignored SIGTERM for %.0f s; killing it", self.proc.pid, grace_s)
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        self._log.close()
        log.info("%s", stop_message(self.proc.returncode, stopped_here=already is None, killed_here=killed))

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def terminate_on_sigterm():
    """SLURM and Snakemake stop jobs with SIGTERM: turn it into SystemExit so servers get stopped."""

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def api_key(engine: dict) -> str | None:
    """The server's API key, from the environment variable the config names (never from the config)."""
    name = engine.get("api_key_env")
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise RuntimeError(f"engine.api_key_env names {name}, but that environment variable is not set")
    return key


@dataclass
class Servers:
    urls: list[str]
    managed: ManagedServer | None = None

    def alive(self) -> bool:
        return self.managed is None or self.managed.alive()


@contextmanager
def servers(
    engine: dict, *, profile: ModelProfile, log_path: Path, key: str | None, incremental_streaming: bool = False
):
    """Where to send requests: a server this job launches (`sglang`, `local`), or running ones (`external`).
    `incremental_streaming`: a launched server streams each chunk's new tokens only (the live loop stop)."""
    kind = engine["kind"]
    if kind == "external":
        yield Servers(list(engine["external"]["urls"]))
        return
    port = free_port()
    env = None
    if kind == "sglang":
        cmd = sglang_command(
            engine,
            port=port,
            context_length=profile.context_length,
            api_key=key,
            incremental_streaming=incremental_streaming,
        )
        env = server_env(engine["sglang"].get("env") or {})
    else:
        cmd = local_engine_command(
            engine,
            port=port,
            context_length=profile.context_length,
            tokenizer=profile.tokenizer,
            trust_remote_code=profile.trust_remote_code,
            incremental_streaming=incremental_streaming,
        )
    server = ManagedServer(
        cmd, port=port, log_path=log_path, startup_timeout_s=float(engine["startup_timeout_s"]), env=env
    )
    with server as url:
        yield Servers([url], server)


@contextmanager
def attempt_logs(server_log: Path):
    """Every attempt of a job keeps its own logs: Snakemake empties a job's declared logs when it
    runs it again, so a killed or failed attempt's evidence would be gone after the rerun.

    Yields the attempt's server log, `attempts/<name>.<time>.<host>.<pid>[.slurm<id>].server.log`
    beside `server_log`; the job's own log lines also go to the same name with `.log`, after a
    header naming the attempt. When the attempt ends (however it ends, short of SIGKILL), its server
    log is copied to `server_log`, where the rule declares it."""
    import shutil

    job = os.environ.get("SLURM_JOB_ID")
    stem = server_log.name.removesuffix(".server.log").removesuffix(".log")
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}.{socket.gethostname()}.{os.getpid()}" + (f".slurm{job}" if job else "")
    folder = server_log.parent / "attempts"
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while (folder / f"{stem}.{tag}{f'-{n}' if n else ''}.log").exists():  # two attempts in one second
        n += 1
    tag += f"-{n}" if n else ""
    client_log, attempt_server_log = folder / f"{stem}.{tag}.log", folder / f"{stem}.{tag}.server.log"
    handler = logging.FileHandler(client_log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    log.info(
        "attempt on %s, pid %d%s; this attempt's logs: %s, %s",
        socket.gethostname(),
        os.getpid(),
        f", SLURM job {job}" if job else "",
        client_log,
        attempt_server_log,
    )
    try:
        yield attempt_server_log
    except BaseException as exc:  # the attempt's own log says how it ended
        log.error("this attempt failed: %s: %s", type(exc).__name__, exc)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
        if attempt_server_log.exists():
            server_log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(attempt_server_log, server_log)
        else:
            server_log.parent.mkdir(parents=True, exist_ok=True)
            server_log.write_text("no server was started by this attempt (nothing to send, or an external server)\n")


def job_facts() -> dict:
    """Where the job ran: the cluster's job id and the GPUs it was given, for provenance."""
    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


async def _server_provenance(urls: list[str], profile: ModelProfile, headers: dict) -> dict:
    from eagle3_datagen.generation.server_info import check_server_info, fetch_info

    infos = {}
    for url in urls:
        server_info = await fetch_info(url, "server_info", headers=headers)
        for warning in check_server_info(server_info, context_length=profile.context_length, url=url):
            log.warning(warning)
        model_info = await fetch_info(url, "model_info", headers=headers)
        infos[url] = {"server_info": redact(server_info), "model_info": redact(model_info)}
    return infos


def seeds_honoured(infos: dict) -> bool:
    """Whether every server honoured the requests' sampling_seed: only with --enable-deterministic-inference."""
    return bool(infos) and all(bool(i["server_info"].get("enable_deterministic_inference")) for i in infos.values())


def server_provenance(urls: list[str], profile: ModelProfile, headers: dict) -> dict:
    """Each server's /server_info and /model_info (secrets hidden), after the start-up checks."""
    return asyncio.run(_server_provenance(urls, profile, headers))
