"""What stops a launched server before it serves: the GPU check before launching, who listens on a
port, the causes named from an exit, and the retry on another port when a job's port is taken."""

import os
import socket
import subprocess
import sys
import time

import pytest

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation.servers import ServerError, servers
from eagle3_datagen.generation.startup import (
    cause,
    check_gpus,
    check_model_path,
    exit_text,
    port_free,
    port_owner,
    visible_gpus,
)
from eagle3_datagen.settings import ModelProfile, defaults
from polling import wait_until


def sglang(tp_size=1, extra=(), model_path="/m", nodes=1):
    block = {
        "python": "python",
        "model_path": model_path,
        "tp_size": tp_size,
        "extra_args": list(extra),
        "nodes": nodes,
    }
    return EngineSettings.from_config({"kind": "sglang", "sglang": block}).server


@pytest.fixture
def dev(tmp_path):
    """A /dev with `n` NVIDIA device files (plus the control files every NVIDIA node has)."""

    def make(n: int):
        folder = tmp_path / f"dev{n}"
        folder.mkdir(exist_ok=True)
        for name in [f"nvidia{i}" for i in range(n)] + (["nvidiactl", "nvidia-uvm"] if n else []):
            (folder / name).touch()
        return folder

    return make


def test_a_job_that_sees_fewer_gpus_than_tp_size_is_refused_naming_what_it_sees_and_slurms_request(dev):
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "77", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1"}
    with pytest.raises(RuntimeError) as refused:
        check_gpus(sglang(tp_size=4), env, dev(8))
    text = str(refused.value)
    assert "engine.sglang.tp_size 4 needs 4 GPUs" in text and "sees 2" in text
    assert "CUDA_VISIBLE_DEVICES='0,1'" in text and "SLURM_GPUS_ON_NODE=2" in text and "SLURM_JOB_GPUS=0,1" in text
    assert "--device cpu" in text


@pytest.mark.parametrize(
    "env, files, seen",
    [
        ({"CUDA_VISIBLE_DEVICES": ""}, 8, 0),  # SLURM hides every GPU from a job that asked for none
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 8, 0),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 8, 0),
        ({"CUDA_VISIBLE_DEVICES": "3,-1,4"}, 8, 1),  # CUDA stops at the first entry naming no device
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 0, 0),  # no driver devices: nothing to run on
        ({}, 0, 0),
        ({}, 4, 4),
        ({"CUDA_VISIBLE_DEVICES": "GPU-6f1e,GPU-77aa"}, 8, 2),
    ],
)
def test_visible_gpus_follow_cuda_visible_devices_and_the_device_files(env, files, seen, dev):
    assert visible_gpus(env, dev(files))[0] == seen


def test_a_job_with_no_gpu_outside_slurm_or_given_none_by_slurm_says_so(dev):
    with pytest.raises(RuntimeError, match=r"sees 0 \(no .*nvidia\* devices\); it is not a SLURM job"):
        check_gpus(sglang(), {}, dev(0))
    with pytest.raises(RuntimeError, match="SLURM job 12 was given no GPUs"):
        check_gpus(sglang(tp_size=8), {"SLURM_JOB_ID": "12", "CUDA_VISIBLE_DEVICES": ""}, dev(8))


def test_enough_gpus_a_cpu_server_another_device_or_an_unknown_node_are_not_refused(dev, tmp_path):
    check_gpus(sglang(tp_size=4), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, dev(8))
    for extra in (["--device", "cpu"], ["--device=cpu"], ["--device", "npu"]):
        check_gpus(sglang(tp_size=8, extra=extra), {"CUDA_VISIBLE_DEVICES": ""}, dev(0))
    check_gpus(sglang(tp_size=16, nodes=2), {}, dev(8))  # 8 a node
    with pytest.raises(RuntimeError, match="needs 8 GPUs"):
        check_gpus(sglang(tp_size=16, nodes=2, extra=["--device", "cuda"]), {}, dev(4))
    check_gpus(sglang(tp_size=4, extra=["--dp-size", "2"]), {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, dev(8))
    with pytest.raises(RuntimeError, match=r"tp_size 4 × data-parallel size 2 needs 8 GPUs on this node.*sees 4"):
        check_gpus(sglang(tp_size=4, extra=["--dp", "2"]), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, dev(8))
    rocm = tmp_path / "rocm"
    rocm.mkdir()
    (rocm / "kfd").touch()
    check_gpus(sglang(tp_size=8), {}, rocm)  # AMD GPUs are not counted here: not refused


def test_servers_refuses_an_sglang_server_before_launching_it_when_no_gpu_is_visible(tmp_path, monkeypatch):
    """The real path: the job's own environment and /dev, with every GPU hidden as SLURM hides them."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sglang = {"python": "/no/such/python", "model_path": "org/model", "tp_size": 2}
    engine = defaults("engine", kind="sglang", sglang=sglang)
    profile = ModelProfile.from_config(defaults("model", name="m", tokenizer="/t", context_length=64))
    started = time.monotonic()
    with pytest.raises(ServerError) as refused:
        with servers(engine, profile=profile, log_path=tmp_path / "server.log", key=None):
            pass
    assert time.monotonic() - started < 5
    assert "was not started" in str(refused.value) and "tp_size 2 needs 2 GPUs" in str(refused.value)
    assert "CUDA_VISIBLE_DEVICES=''" in str(refused.value)
    assert not (tmp_path / "server.log").exists()  # nothing was launched


def test_a_model_path_shaped_as_a_local_path_must_exist(tmp_path):
    check_model_path(sglang(model_path=str(tmp_path)))
    check_model_path(sglang(model_path="moonshotai/Kimi-K2.5"))  # a hub id: the server's to find
    for missing in (str(tmp_path / "nothing"), "./nothing", "../nothing", "~/no/such/model"):
        with pytest.raises(RuntimeError, match=f"engine.sglang.model_path {missing} does not exist"):
            check_model_path(sglang(model_path=missing))


def test_exit_codes_and_known_causes_are_named():
    assert exit_text(247) == "code 247: killed by SIGKILL" and exit_text(-9) == "code -9: killed by SIGKILL"
    assert exit_text(137) == "code 137: killed by SIGKILL" and exit_text(1) == "code 1"
    assert "engine.sglang.python /x/python cannot be run" in cause(127, "", python="/x/python")
    missing = "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/no/model'."
    assert "engine.sglang.model_path /no/model is not a model" in cause(1, f"x\n{missing}\ny", model_path="/no/model")
    assert "OOM killer" in cause(247, "nothing known")
    assert cause(1, "Traceback\n  File x\nValueError: bad thing\n") == "its last error: ValueError: bad thing"


def test_a_port_is_told_free_ours_or_another_process(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen()
        assert not port_free(port)
        assert port_owner(port, os.getpgid(0)) == "ours"
        # A child in a process group of its own: this process's listener is another process's to it.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        try:
            assert port_owner(port, child.pid) == "other"
        finally:
            child.kill()
            child.wait()
    assert port_owner(port, os.getpgid(0)) is None and port_free(port)


def test_a_port_taken_while_the_server_starts_is_given_up_once_for_another(tmp_path, monkeypatch, qwen3_tokenizer_dir):
    """The race between choosing a free port and the server binding it: another process listens on
    the chosen port first. The job stops that server at once and starts one on another port; where
    that port is taken too, it fails naming both."""
    from eagle3_datagen.generation import servers as module

    taken = []

    def take_a_port():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken.append(s)
        return s.getsockname()[1]

    engine = defaults("engine", kind="local", startup_timeout_s=600, local={"backend": "scripted"})
    profile = ModelProfile.from_config(
        defaults("model", name="m", tokenizer=str(qwen3_tokenizer_dir), context_length=64)
    )
    real = module.free_port
    ports = iter([take_a_port()])
    monkeypatch.setattr(module, "free_port", lambda: next(ports, None) or real())
    try:
        with servers(engine, profile=profile, log_path=tmp_path / "server.log", key=None) as srv:
            assert srv.urls[0] != f"http://127.0.0.1:{taken[0].getsockname()[1]}" and srv.alive()
        first, second = take_a_port(), take_a_port()
        ports = iter([first, second])
        started = time.monotonic()
        with pytest.raises(ServerError) as failed:
            with servers(engine, profile=profile, log_path=tmp_path / "server2.log", key=None):
                pass
        assert time.monotonic() - started < 120
        text = str(failed.value)
        assert f"port {second} is in use by another process, as port {first} was on the first try" in text
        assert "given up after one retry" in text and "its last lines" in text
    finally:
        for s in taken:
            s.close()


def test_the_watchdog_says_when_its_program_cannot_be_run_and_clears_what_a_dead_server_left(tmp_path):
    def watchdog(*cmd):
        return [sys.executable, "-m", "eagle3_datagen.generation.watchdog", "--parent", str(os.getpid()), "--", *cmd]

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(watchdog("/no/such/program"), capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 127 and "cannot run /no/such/program" in done.stderr
    # A server that exits during start-up and leaves a child behind (a scheduler): the child goes too.
    pid_file = tmp_path / "child.pid"
    server = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); sys.exit(5)"
    )
    proc = subprocess.run(watchdog(sys.executable, "-c", server), env=env, timeout=120, start_new_session=True)
    assert proc.returncode == 5
    child = int(pid_file.read_text())
    wait_until(lambda: not _alive(child), "the left child to be stopped", timeout_s=60)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_port_extra_args_fix_is_read_as_sglang_reads_it():
    from eagle3_datagen.generation.startup import user_port

    assert user_port(["--port", "30000"]) == user_port(["--por=30000"]) == 30000  # a prefix SGLang takes
    assert user_port(["--served-model-name", "port", "--log-level", "info"]) is None  # a value, not the flag
    assert user_port(["--port", "1", "--port", "2"]) == 2  # the last one wins, as in argparse
