"""The first minutes on a cluster, with the real SGLang 0.5.23 server on CPU: each way a launched
server fails to start ends the job within seconds of its cause, not at engine.startup_timeout_s
(600 here), with one message naming the cause and showing the server log's last lines, and leaves
none of the server's processes behind.

The launch code runs in-process (`servers`, as the generate job calls it): a whole workflow would add
nothing to what is proven here. The bounds are sized for a loaded 2-core machine, far below 600 s.
"""

import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

import sglang_server
from eagle3_datagen.generation import servers as servers_module
from eagle3_datagen.generation.servers import ServerError, free_port, servers
from eagle3_datagen.settings import ModelProfile, defaults
from polling import wait_until
from real_sglang import descendants, server_python

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

STARTUP_TIMEOUT_S = 600
BOUND_S = 120  # far below the start-up timeout, generous for a loaded 2-core machine


def sglang_engine(model_dir, **sglang) -> dict:
    return defaults(
        "engine",
        kind="sglang",
        startup_timeout_s=STARTUP_TIMEOUT_S,
        sglang={
            "python": server_python(),
            "model_path": str(model_dir),
            "tp_size": 1,
            "env": dict(sglang_server.CPU_ENV),
            "extra_args": [*sglang_server.CPU_ARGS, "--max-total-tokens", "4096"],
            **sglang,
        },
    )


def start_failure(engine: dict, model_dir, log_path: Path) -> tuple[str, float]:
    """The job's error when its server fails to start, and the seconds it took; asserts no server
    process is left."""
    profile = ModelProfile.from_config(defaults("model", name="m", tokenizer=str(model_dir), context_length=512))
    started = time.monotonic()
    with pytest.raises(ServerError) as failed:
        with servers(engine, profile=profile, log_path=log_path, key=None):
            pass
    took = time.monotonic() - started
    left = descendants(os.getpid())
    assert not left, f"server processes left behind: {left}"
    return str(failed.value), took


def assert_shows_the_log(message: str, log_path: Path, *lines: str) -> None:
    """The message holds the log's last lines, among them `lines`."""
    assert f"Its log is {log_path}; its last lines:" in message, message
    tail = message.split("its last lines:\n", 1)[1]
    last = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()][-1]
    assert last[:200] in tail, (last, tail)
    for line in lines:
        assert line in tail, (line, tail)


def test_a_model_path_that_does_not_exist_is_refused_before_launching(tmp_path, demo_model_dir):
    model_path = tmp_path / "no-such-model"
    log_path = tmp_path / "server.log"
    message, took = start_failure(sglang_engine(demo_model_dir, model_path=str(model_path)), demo_model_dir, log_path)
    assert took < 5, took
    assert f"was not started: engine.sglang.model_path {model_path} does not exist" in message, message
    assert not log_path.exists()


@pytest.mark.parametrize("where", ["empty directory", "hub id"])
def test_a_model_path_without_a_model(where, tmp_path, demo_model_dir, monkeypatch):
    """A directory without a model, or a path the server reads as a hub id (no such directory here;
    offline, as compute nodes often are), fail in the server: named from its log."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_path = "empty-model" if where == "empty directory" else "no-such-org/no-such-model"
    if where == "empty directory":
        (tmp_path / model_path).mkdir()
    log_path = tmp_path / "server.log"
    message, took = start_failure(sglang_engine(demo_model_dir, model_path=model_path), demo_model_dir, log_path)
    assert took < BOUND_S, took
    meaning = "is not a model SGLang can load" if where == "empty directory" else "is no local directory"
    assert f"engine.sglang.model_path {model_path} {meaning}" in message, message
    assert "exited with code 1 during start-up" in message
    assert_shows_the_log(message, log_path)


@pytest.mark.parametrize("which", ["the pipeline's own", "missing"])
def test_a_python_that_is_not_sglangs(which, tmp_path, demo_model_dir):
    python = sys.executable if which == "the pipeline's own" else str(tmp_path / "no" / "bin" / "python")
    log_path = tmp_path / "server.log"
    message, took = start_failure(sglang_engine(demo_model_dir, python=python), demo_model_dir, log_path)
    assert took < BOUND_S, took
    if which == "missing":
        assert f"engine.sglang.python {python} cannot be run: no such program" in message, message
        assert_shows_the_log(message, log_path, f"cannot run {python}: No such file or directory")
    else:
        assert f"engine.sglang.python {python} is not SGLang's interpreter: it has no sglang module" in message
        assert_shows_the_log(message, log_path, "No module named 'sglang'")


@contextmanager
def listening(port: int | None = None):
    """Another process's listener (as far as the server is concerned) on `port`, or on a free one."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port or 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_the_user_fixed_that_is_in_use(tmp_path, demo_model_dir):
    """`--port N` in extra_args is the server's port; N taken: refused before launching (the server
    would find out only after loading the model, when it binds)."""
    log_path = tmp_path / "server.log"
    with listening() as port:
        engine = sglang_engine(demo_model_dir)
        engine["sglang"]["extra_args"] += ["--port", str(port)]
        message, took = start_failure(engine, demo_model_dir, log_path)
    assert took < 5, took
    assert f"port {port} (--port in engine.sglang.extra_args) is in use by another process" in message, message
    assert "was not started" in message and not log_path.exists()


def test_a_port_taken_while_the_server_starts(tmp_path, demo_model_dir, monkeypatch):
    """The race between choosing a free port and the server binding it (after loading the model):
    another process listens on the port while the server starts. The job stops that server at once
    and tries one other port; taken the same way, it fails naming both ports."""
    ports = [free_port(), free_port()]
    chosen = iter(ports)
    monkeypatch.setattr(servers_module, "free_port", lambda: next(chosen))
    taken, held, stop = [], [], threading.Event()

    log_path = tmp_path / "server.log"

    def size() -> int:
        return log_path.stat().st_size if log_path.exists() else 0

    def take_each_port_once_its_server_runs():
        for port in ports:  # once its server has started and logged (it binds only after loading)
            while not stop.is_set() and not any(f"--port {port}" in c for c in descendants(os.getpid()).values()):
                time.sleep(0.1)
            before = size()
            while not stop.is_set() and size() == before:
                time.sleep(0.1)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
            taken.append(time.monotonic())

    thief = threading.Thread(target=take_each_port_once_its_server_runs, daemon=True)
    thief.start()
    try:
        message, took = start_failure(sglang_engine(demo_model_dir), demo_model_dir, log_path)
        failed_at = time.monotonic()
    finally:
        stop.set()
        thief.join(10)
        for s in held:
            s.close()
    assert len(taken) == 2 and failed_at - taken[1] < BOUND_S, (taken, failed_at)
    assert took < 2 * BOUND_S, took
    assert f"port {ports[1]} is in use by another process, as port {ports[0]} was on the first try" in message
    assert "given up after one retry" in message and "This job stopped it" in message, message
    assert_shows_the_log(message, log_path)


def test_an_argument_the_server_refuses(tmp_path, demo_model_dir):
    engine = sglang_engine(demo_model_dir)
    engine["sglang"]["extra_args"] += ["--no-such-flag"]
    log_path = tmp_path / "server.log"
    message, took = start_failure(engine, demo_model_dir, log_path)
    assert took < BOUND_S, took
    assert "it refused its command line (engine.sglang.extra_args)" in message, message
    assert "exited with code 2 during start-up" in message
    assert_shows_the_log(message, log_path, "error: unrecognized arguments: --no-such-flag")


def test_a_server_killed_during_start_up(tmp_path, demo_model_dir):
    """As the kernel's OOM killer does: the scheduler (the largest process) is SIGKILLed while the
    model loads."""
    killed = []

    def kill_the_scheduler():
        scheduler = wait_until(
            lambda: [p for p, c in descendants(os.getpid()).items() if c.startswith("sglang::scheduler")],
            "the server's scheduler to start",
            timeout_s=STARTUP_TIMEOUT_S,
        )
        os.kill(scheduler[0], signal.SIGKILL)
        killed.append(time.monotonic())

    killer = threading.Thread(target=kill_the_scheduler, daemon=True)
    killer.start()
    log_path = tmp_path / "server.log"
    message, took = start_failure(sglang_engine(demo_model_dir), demo_model_dir, log_path)
    failed_at = time.monotonic()
    killer.join(10)
    assert killed and failed_at - killed[0] < BOUND_S, (killed, failed_at)
    assert "killed by SIGKILL" in message and "OOM killer" in message and "engine.job.mem_mb" in message, message
    assert_shows_the_log(message, log_path, "scheduler died during initialization (exit code: -9)")


def test_no_gpu_visible_is_refused_before_launching_but_a_cpu_server_is_not(tmp_path, demo_model_dir, monkeypatch):
    """A GPU server (no --device cpu, as on a cluster) in a job that sees no GPU: refused before
    anything starts. The CPU server of the rest of this tier runs in the same job environment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    gpu = sglang_engine(demo_model_dir, env={}, extra_args=[], tp_size=2)
    log_path = tmp_path / "server.log"
    message, took = start_failure(gpu, demo_model_dir, log_path)
    assert took < 5, took
    assert "engine.sglang.tp_size 2 needs 2 GPUs on this node, but this job sees 0" in message, message
    assert "CUDA_VISIBLE_DEVICES=''" in message and "SLURM job 4242 was given no GPUs" in message
    assert not log_path.exists()
    # --device cpu: not refused. It fails later, on a flag it refuses: proof that it was launched.
    cpu = sglang_engine(demo_model_dir, tp_size=2)
    cpu["sglang"]["extra_args"] += ["--no-such-flag"]
    message, _ = start_failure(cpu, demo_model_dir, log_path)
    assert "refused its command line" in message, message


def test_a_host_in_extra_args_is_where_the_server_listens_and_the_job_reaches_it(tmp_path, demo_model_dir):
    """`--host` copied from a model card: the server binds there (here a loopback address other than
    127.0.0.1, where a job that looked at 127.0.0.1 would never find it), and the job reaches it there."""
    engine = sglang_engine(demo_model_dir)
    engine["sglang"]["extra_args"] += ["--host", "127.0.0.2"]
    profile = ModelProfile.from_config(defaults("model", name="m", tokenizer=str(demo_model_dir), context_length=512))
    with servers(engine, profile=profile, log_path=tmp_path / "server.log", key=None) as running:
        url = running.urls[0]
        assert url.startswith("http://127.0.0.2:"), url
        with urllib.request.urlopen(f"{url}/model_info", timeout=30) as resp:
            assert json.load(resp)["model_path"] == str(demo_model_dir)
    assert not descendants(os.getpid())
