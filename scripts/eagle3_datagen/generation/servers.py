"""The servers a generate job talks to: launched ones (`sglang`, `local`) or running ones (`external`).

A launched server runs in its own process group with its own log; start-up watches the process, who
listens on its port, and `GET /health` (the checks and causes are `startup`'s, the command lines
`launch`'s); stopping sends SIGTERM to the group, then SIGKILL. Also: SIGTERM handling, where the job
ran (provenance), and each attempt's own logs.
"""

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from pathlib import Path

from eagle3_datagen.engine_settings import EngineSettings, SGLangServer
from eagle3_datagen.generation.launch import local_engine_command, server_env, sglang_command
from eagle3_datagen.generation.nodes import across_nodes
from eagle3_datagen.generation.redact import redact_command
from eagle3_datagen.generation.startup import (
    ServerError,
    cause,
    check_gpus,
    check_model_path,
    exit_text,
    last_error,
    log_tail,
    port_free,
    port_owner,
    user_port,
)
from eagle3_datagen.generation.watchdog import package_env, watched
from eagle3_datagen.settings import ModelProfile

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# Exit codes of a server stopped by SIGTERM (15): killed by the signal (-15), its shell convention
# (143 = 128 + 15), a Python sys.exit(-15) as the watchdog passes it on (241 = 256 - 15), or 0.
# SGLang 0.5.23 ends its own orderly SIGTERM shutdown by SIGKILLing itself (kill_process_tree with
# include_parent, srt/utils/common.py), so -9 (247 through the watchdog) is normal too when it came
# before this job's own SIGKILL.
STOPPED_BY_SIGTERM = {0, -15, 143, 241, -9, 247}


def stop_message(code: int | None, *, stopped_here: bool, killed_here: bool = False) -> str:
    """How a server's end reads in the log: a stop this job asked for is normal, whatever its code."""
    if not stopped_here:
        return f"the server had already exited by itself, with exit code {code}"
    if killed_here:
        return "server killed (SIGKILL) after it ignored SIGTERM"
    if code in STOPPED_BY_SIGTERM:
        return f"server stopped normally (SIGTERM from this job; exit code {code})"
    return f"server stopped after SIGTERM, with exit code {code}"


class PortTaken(ServerError):
    """Another process listens on the server's port: it cannot bind it (a launcher's port may be retried)."""


@dataclass(eq=False)
class ManagedServer:
    """A server process owned by this job: `with ManagedServer(...) as url:`. Start-up ends at the
    first of: `/health` answering 200 from its own process group, its exit, another process on its
    port, `startup_timeout_s`; any but the first stops the group and raises one ServerError (the
    cause, as `describe(exit code, log tail)` names it, then the log's last lines)."""

    cmd: list[str] = field(repr=False)  # may hold the API key
    _: KW_ONLY
    port: int
    log_path: Path
    startup_timeout_s: float = 600.0
    env: dict | None = field(default=None, repr=False)  # may hold the API key
    describe: Callable[[int, str], str] = lambda code, tail: last_error(tail)
    label: str = "the server"
    watch: Callable[[], str | None] | None = None  # while it starts: the cause of a failure elsewhere (a rank)
    port_note: str = ""  # what the message adds when the port is taken (a retry's history)
    host: str = "127.0.0.1"  # where this job reaches it
    proc: subprocess.Popen | None = field(default=None, init=False)

    def __post_init__(self):
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address in a URL
        self.url, self.log_path = f"http://{host}:{self.port}", Path(self.log_path)

    def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        log.info("starting server: %s (log: %s)", redact_command(self.cmd), self.log_path)
        self.started = time.monotonic()
        env = package_env(dict(os.environ if self.env is None else self.env))
        self.proc = subprocess.Popen(
            watched(self.cmd), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _failed(self, cause: str, error=ServerError) -> ServerError:
        took, code = time.monotonic() - self.started, self.proc.poll()
        self.stop()  # before the log is read: it is whole once the group is gone
        how = f"It exited with {exit_text(code)} during start-up" if code is not None else "This job stopped it"
        return error(
            f"{self.label} did not start: {cause}. {how}, after {took:.0f} s "
            f"(engine.startup_timeout_s {self.startup_timeout_s:.0f}). Its log is {self.log_path}; its last "
            f"lines:\n{log_tail(self.log_path)}"
        )

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.1
        while True:
            code = self.proc.poll()
            # Whoever listens on the port: an answer from another process is not this server's, and
            # the server cannot bind a port another process listens on (it fails late, after loading).
            owner = port_owner(self.port, self.proc.pid)
            if owner == "other" or (code is not None and not port_free(self.port)):
                raise self._failed(f"port {self.port} is in use by another process{self.port_note}", PortTaken)
            if code is not None:
                raise self._failed(self.describe(code, log_tail(self.log_path, 200)))
            if self.watch is not None and (elsewhere := self.watch()):
                raise self._failed(elsewhere)
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        log.info("server healthy at %s after pid %d start", self.url, self.proc.pid)
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise self._failed(f"it did not become healthy within {self.startup_timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None or self._log.closed:
            return
        already, killed = self.proc.poll(), False
        if already is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                killed = True
                log.warning("server pid %d ignored SIGTERM for %.0f s; killing it", self.proc.pid, grace_s)
                with suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
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


@dataclass
class Servers:
    urls: list[str]
    managed: ManagedServer | None = None
    ranks: object = None  # nodes.Ranks: the other ranks of a server across nodes

    def alive(self) -> bool:
        return (self.managed is None or self.managed.alive()) and (self.ranks is None or self.ranks.alive())


@contextmanager
def servers(
    engine: EngineSettings | dict,
    *,
    profile: ModelProfile,
    log_path: Path,
    key: str | None,
    incremental_streaming: bool = False,
):
    """Where to send requests: a server this job launches (`sglang`, `local`; streaming each chunk's
    new tokens only with `incremental_streaming`), or running ones (`external`). A port this job chose
    and another process took while the server started (it binds late) is given up once for another."""
    engine = EngineSettings.of(engine)
    if not engine.server.launched:
        yield Servers(list(engine.server.urls))
        return
    launch = partial(_managed_server, engine, profile, log_path=log_path, key=key, streaming=incremental_streaming)
    if engine.nodes > 1:  # rank 0 here, launched as any server is; the other ranks: `nodes`
        port = user_port(list(engine.server.extra_args)) or free_port()
        with across_nodes(
            engine, port=port, profile=profile, log_path=log_path, key=key, streaming=incremental_streaming
        ) as ranks:
            ranks.head = launch(port=port, rank_args=ranks.head_args, watch=ranks.failed_rank)
            with ranks.head as url:
                yield Servers([url], ranks.head, ranks)
        return
    fixed = None
    if isinstance(engine.server, SGLangServer):
        try:
            check_model_path(engine.server)
            check_gpus(engine.server)
        except RuntimeError as exc:
            raise ServerError(f"the SGLang server was not started: {exc}") from None
        fixed = user_port(list(engine.server.extra_args))
        if fixed is not None and not port_free(fixed):
            raise ServerError(
                f"the SGLang server was not started: port {fixed} (--port in engine.sglang.extra_args) is in use "
                "by another process; give another port, or drop --port and let the job choose a free one"
            )
    note = " (--port in engine.sglang.extra_args)" if fixed is not None else ""
    for attempt in (1, 2):
        port = fixed or free_port()
        server = launch(port=port)
        server.port_note = note
        try:
            url = server.start()
            break
        except PortTaken as exc:
            if fixed is not None or attempt == 2:
                raise
            log.warning("%s\nstarting it again on another port", exc)
            note = f", as port {port} was on the first try: given up after one retry"
    try:
        yield Servers([url], server)
    finally:
        server.stop()


def _managed_server(
    engine: EngineSettings, profile: ModelProfile, *, port: int, log_path: Path, key: str | None, streaming: bool,
    rank_args: tuple[str, ...] = (), watch=None,
) -> ManagedServer:  # fmt: skip
    """The launched server of `engine` (kind sglang or local), listening on `port`, not yet started
    (`rank_args` and `watch`: rank 0 of a server across nodes, see `nodes`)."""
    sglang, timeout, context = engine.server, engine.startup_timeout_s, profile.context_length
    if not isinstance(sglang, SGLangServer):
        cmd = local_engine_command(
            engine,
            port=port,
            context_length=context,
            tokenizer=profile.tokenizer,
            trust_remote_code=profile.trust_remote_code,
            incremental_streaming=streaming,
        )
        return ManagedServer(cmd, port=port, log_path=log_path, startup_timeout_s=timeout, label="the local engine")
    cmd = sglang_command(engine, port=port, context_length=context, api_key=key, incremental_streaming=streaming)
    return ManagedServer(
        cmd + list(rank_args),
        port=port,
        log_path=log_path,
        startup_timeout_s=timeout,
        env=server_env(sglang.env),
        describe=lambda code, tail: cause(code, tail, python=sglang.python, model_path=sglang.model_path),
        label="the SGLang server" + (" (rank 0)" if rank_args else ""),
        watch=watch,
        host=sglang.client_host,
    )


@contextmanager
def attempt_logs(server_log: Path):
    """Every attempt of a job keeps its own logs (Snakemake empties a job's declared logs when it
    reruns it): yields `attempts/<name>.<time>.<host>.<pid>[.slurm<id>].server.log` beside
    `server_log`, the job's own lines going to the same name with `.log`. When the attempt ends
    (short of SIGKILL), its server log is copied to `server_log`, where the rule declares it."""
    job, host, pid = os.environ.get("SLURM_JOB_ID"), socket.gethostname(), os.getpid()
    stem = server_log.name.removesuffix(".server.log").removesuffix(".log")
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}.{host}.{pid}" + (f".slurm{job}" if job else "")
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
    slurm = f", SLURM job {job}" if job else ""
    log.info("attempt on %s, pid %d%s; this attempt's logs: %s, %s", host, pid, slurm, client_log, attempt_server_log)
    try:
        yield attempt_server_log
    except BaseException as exc:  # the attempt's own log says how it ended
        log.error("this attempt failed: %s: %s", type(exc).__name__, exc)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
        server_log.parent.mkdir(parents=True, exist_ok=True)
        if attempt_server_log.exists():
            shutil.copyfile(attempt_server_log, server_log)
        else:
            server_log.write_text("no server was started by this attempt (nothing to send, or an external server)\n")


def job_facts() -> dict:
    """Where the job ran: the cluster's job id and the GPUs it was given, for provenance."""
    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
