"""The servers a generate job talks to: launched ones (`sglang`, `local`) or running ones (`external`).

One code path for every engine that launches a process: the server runs in its own process group
with its own log; start-up watches both the process and `GET /health`; stopping sends SIGTERM to the
group, then SIGKILL. Failure is detected from the process state and HTTP status, never by matching
log text. Also here: the API key (from the environment, never the config), SIGTERM handling, and
the server facts recorded as provenance.
"""

import asyncio
import logging
import os
import shlex
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


# Launch flags that would change or cut the data: parsers rewrite tokens on the chat layer (and a
# server for this pipeline needs none), auto-truncation silently cuts prompts, and without the
# tokenizer the server cannot check what it is given.
REFUSED_SGLANG_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--allow-auto-truncate", "--skip-tokenizer-init")


def check_extra_args(args: list[str]) -> None:
    """Refuse launch arguments that would reshape or cut the generated data."""
    bad = [a for a in args if a.split("=", 1)[0] in REFUSED_SGLANG_FLAGS]
    if bad:
        raise ValueError(
            f"engine.sglang.extra_args: {', '.join(bad)} would reshape or cut the generated data; remove it"
        )


def sglang_command(engine: dict, *, port: int, context_length: int, api_key: str | None = None) -> list[str]:
    """`python -m sglang.launch_server ...` from the config, bound to localhost on `port`."""
    sglang = engine["sglang"]
    extra = [str(a) for a in sglang["extra_args"]]
    check_extra_args(extra)
    cmd = [
        sglang["python"],
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(sglang["model_path"]),
        "--tp-size",
        str(sglang["tp_size"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        str(context_length),
    ]
    if sglang["trust_remote_code"]:
        cmd.append("--trust-remote-code")
    if engine["deterministic_inference"]:
        cmd.append("--enable-deterministic-inference")
    if sglang["mem_fraction_static"] is not None:
        cmd += ["--mem-fraction-static", str(sglang["mem_fraction_static"])]
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + extra


# Extra arguments for the local engine, from the environment: how tests inject latency, faults
# and a request record (`--error-rate 0.1 --record-dir DIR`, see `python -m eagle3_datagen.engine
# -h`) into the engines that generate jobs launch, without a switch in the user's config.
LOCAL_ENGINE_ARGS_ENV = "EAGLE3_DATAGEN_ENGINE_ARGS"


def local_engine_command(
    engine: dict, *, port: int, context_length: int, tokenizer: str, trust_remote_code: bool = False
) -> list[str]:
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
        str(local["max_batch"]),
    ]
    if trust_remote_code:  # as the model profile says, like SGLang's --trust-remote-code
        cmd.append("--trust-remote-code")
    if engine["deterministic_inference"]:
        cmd.append("--enable-deterministic-inference")
    return cmd + shlex.split(os.environ.get(LOCAL_ENGINE_ARGS_ENV, ""))


# Exit codes of a server stopped by SIGTERM: killed by the signal (-15), its shell convention
# (143 = 128 + 15), a Python sys.exit(-15) as the watchdog passes it on (241 = 256 - 15), or 0.
STOPPED_BY_SIGTERM = {0, -signal.SIGTERM, 128 + signal.SIGTERM, 256 - signal.SIGTERM}


def stop_message(code: int | None, *, stopped_here: bool) -> str:
    """How a server's end reads in the log: a stop this job asked for is normal, whatever its code."""
    if not stopped_here:
        return f"the server had already exited by itself, with exit code {code}"
    if code in STOPPED_BY_SIGTERM:
        return f"server stopped normally (SIGTERM from this job; exit code {code})"
    if code == -signal.SIGKILL:
        return "server killed (SIGKILL) after it ignored SIGTERM"
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
        already = self.proc.poll()
        if already is None:
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
        log.info("%s", stop_message(self.proc.returncode, stopped_here=already is None))

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
def servers(engine: dict, *, profile: ModelProfile, log_path: Path, key: str | None):
    """Where to send requests: a server this job launches (`sglang`, `local`), or running ones (`external`)."""
    kind = engine["kind"]
    if kind == "external":
        yield Servers(list(engine["external"]["urls"]))
        return
    port = free_port()
    if kind == "sglang":
        cmd = sglang_command(engine, port=port, context_length=profile.context_length, api_key=key)
    else:
        cmd = local_engine_command(
            engine,
            port=port,
            context_length=profile.context_length,
            tokenizer=profile.tokenizer,
            trust_remote_code=profile.trust_remote_code,
        )
    server = ManagedServer(cmd, port=port, log_path=log_path, startup_timeout_s=float(engine["startup_timeout_s"]))
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
