"""Launch commands, refused flags, secrets kept out of logs and provenance, GPU requests."""

import json
import os
import signal
import subprocess
import sys

import pytest

from eagle3_datagen.generation.launch import local_engine_command, server_env, sglang_command
from eagle3_datagen.generation.redact import is_secret_name, redact, redact_command
from eagle3_datagen.settings import defaults
from eagle3_datagen.workflow import check_engine, server_resources
from polling import wait_until

SGLANG = defaults(
    "engine",
    kind="sglang",
    sglang={
        "python": "/envs/sglang/bin/python",
        "model_path": "/models/kimi",
        "tp_size": 8,
        "trust_remote_code": True,
        "mem_fraction_static": 0.85,
        "extra_args": ["--dp", "2"],
    },
)


def test_sglang_command_follows_the_config():
    cmd = sglang_command(SGLANG, port=31234, context_length=131072, api_key="s3cret")
    assert cmd[:3] == ["/envs/sglang/bin/python", "-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for part in (
        "--model-path /models/kimi",
        "--tp-size 8",
        "--host 127.0.0.1",
        "--port 31234",
        "--context-length 131072",
        "--trust-remote-code",
        "--mem-fraction-static 0.85",
        "--api-key s3cret",
        "--dp 2",
    ):
        assert part in joined


def test_server_env_puts_the_config_on_top_of_the_jobs_environment_and_logs_only_names(monkeypatch, caplog):
    monkeypatch.setenv("HF_HOME", "/job/hf")
    monkeypatch.setenv("KEPT_FROM_JOB", "yes")
    caplog.set_level("INFO")
    env = server_env(
        {"HF_HOME": "/scratch/hf", "NCCL_IB_DISABLE": 1, "SGLANG_USE_CPU_ENGINE": True, "HF_TOKEN": "hf_s3cret"}
    )
    assert env["HF_HOME"] == "/scratch/hf" and env["KEPT_FROM_JOB"] == "yes"
    assert env["NCCL_IB_DISABLE"] == "1" and env["SGLANG_USE_CPU_ENGINE"] == "true"
    assert "HF_TOKEN" in caplog.text and "hf_s3cret" not in caplog.text
    assert defaults("engine", kind="sglang", sglang={"model_path": "m"})["sglang"]["env"] == {}


@pytest.mark.parametrize(
    "flag", ["--reasoning-parser", "--tool-call-parser=kimi_k2", "--allow-auto-truncate", "--skip-tokenizer-init"]
)
def test_flags_that_corrupt_data_are_refused(flag):
    engine = json.loads(json.dumps(SGLANG))
    engine["sglang"]["extra_args"] = [flag, "kimi_k2"] if "=" not in flag and "parser" in flag else [flag]
    with pytest.raises(ValueError, match=flag.split("=")[0]):
        check_engine(engine)
    with pytest.raises(ValueError, match="reshape or cut"):
        sglang_command(engine, port=1, context_length=10)


def test_the_api_key_never_reaches_a_log_line_or_provenance():
    cmd = sglang_command(SGLANG, port=1, context_length=10, api_key="s3cret")
    assert "s3cret" not in redact_command(cmd) and "--api-key ***" in redact_command(cmd)
    assert "s3cret" not in redact_command(["x", "--api-key=s3cret"]) and "--api-key=***" in redact_command(
        ["x", "--api-key=s3cret"]
    )
    info = {"api_key": "s3cret", "admin_api_key": "other", "tp_size": 8, "nested": [{"hf_token": "t"}]}
    clean = redact(info)
    assert "s3cret" not in json.dumps(clean) and "other" not in json.dumps(clean) and clean["tp_size"] == 8
    assert clean["nested"] == [{"hf_token": "***"}]


def test_only_whole_secret_names_are_masked():
    """Provenance stays readable: names that merely contain 'token' keep their values."""
    info = {
        "tokenizer_path": "/models/kimi",
        "max_total_num_tokens": 812345,
        "skip_tokenizer_init": False,
        "tokenizer_mode": "auto",
        "api_key": "k",
        "access_token": "t",
        "password": "p",
    }
    clean = redact(info)
    assert clean["tokenizer_path"] == "/models/kimi" and clean["max_total_num_tokens"] == 812345
    assert clean["skip_tokenizer_init"] is False and clean["tokenizer_mode"] == "auto"
    assert clean["api_key"] == clean["access_token"] == clean["password"] == "***"
    assert not is_secret_name("--tokenizer-path") and is_secret_name("--api-key")
    assert (
        redact_command(["--tokenizer-path", "/t", "--max-total-tokens", "9"])
        == "--tokenizer-path /t --max-total-tokens 9"
    )


def test_the_local_engine_takes_test_options_from_the_environment_only(monkeypatch):
    engine = defaults("engine", kind="local", local={"backend": "scripted", "model_dir": "/m"})
    monkeypatch.delenv("EAGLE3_DATAGEN_ENGINE_ARGS", raising=False)
    plain = local_engine_command(engine, port=5, context_length=64, tokenizer="/t")
    assert "--error-rate" not in plain and plain[plain.index("--max-batch") + 1] == "16"
    monkeypatch.setenv("EAGLE3_DATAGEN_ENGINE_ARGS", "--error-rate 0.5 --record-dir '/tmp/a b'")
    assert local_engine_command(engine, port=5, context_length=64, tokenizer="/t")[-4:] == [
        "--error-rate",
        "0.5",
        "--record-dir",
        "/tmp/a b",
    ]


def test_gpus_follow_tensor_parallel_size_and_the_plan(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"to_send": 5}))
    assert server_resources(SGLANG, plan)["gpu"] == 8
    assert (
        server_resources(defaults("engine", kind="local", local={"backend": "scripted", "gpus": 1}), plan)["gpu"] == 1
    )
    assert server_resources({"kind": "external", "external": {"urls": ["http://x"]}}, plan)["gpu"] == 0
    plan.write_text(json.dumps({"to_send": 0}))
    assert server_resources(SGLANG, plan)["gpu"] == 0  # nothing to send: no GPU held


def test_the_watchdog_stops_the_server_when_its_job_dies(tmp_path):
    pid_file = tmp_path / "server.pid"
    server = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    job = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-m', 'eagle3_datagen.generation.watchdog', '--parent', str(__import__('os').getpid()), '--', sys.executable, '-c', {server!r}], start_new_session=True); "
        "time.sleep(120)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", job], env=env)
    try:
        server_pid = int(
            wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the server starts", timeout_s=120)
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the job dies without any chance to clean up
        proc.wait()

    def gone():
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_until(gone, "the server stops with its job", timeout_s=120)
    except AssertionError:
        os.kill(server_pid, signal.SIGKILL)
        raise


def test_deterministic_inference_reaches_the_servers_a_job_launches():
    engine = json.loads(json.dumps(SGLANG))
    assert "--enable-deterministic-inference" not in sglang_command(engine, port=1, context_length=10)
    engine["deterministic_inference"] = True
    assert "--enable-deterministic-inference" in sglang_command(engine, port=1, context_length=10)
    local = defaults("engine", kind="local", deterministic_inference=True, local={"backend": "scripted"})
    assert "--enable-deterministic-inference" in local_engine_command(local, port=5, context_length=64, tokenizer="/t")


def test_every_attempt_keeps_its_own_logs(tmp_path, caplog):
    import logging
    import signal

    from eagle3_datagen.generation.servers import attempt_logs, stop_message

    caplog.set_level(logging.INFO)  # as a job's logging is set up
    server_log = tmp_path / "logs" / "generate" / "c" / "shard_0.server.log"
    for attempt in range(2):
        with attempt_logs(server_log) as attempt_server_log:
            logging.getLogger("eagle3_datagen.test").warning("attempt %d says hello", attempt)
            attempt_server_log.write_text(f"server of attempt {attempt}\n")
        assert server_log.read_text() == f"server of attempt {attempt}\n"  # the declared log: the last attempt's
    folder = server_log.parent / "attempts"
    client_logs = sorted(p for p in folder.iterdir() if not p.name.endswith(".server.log"))
    server_logs = sorted(p for p in folder.iterdir() if p.name.endswith(".server.log"))
    assert len(client_logs) == len(server_logs) == 2
    texts = [p.read_text() for p in client_logs]
    assert all("attempt on" in t and "pid" in t for t in texts)
    assert sorted("attempt 0 says hello" in t for t in texts) == [False, True]
    assert {p.read_text() for p in server_logs} == {"server of attempt 0\n", "server of attempt 1\n"}
    # A stop the job asked for reads as normal, whatever the signal made of the exit code.
    # SGLang 0.5.23 ends its SIGTERM shutdown by SIGKILLing itself: -9, or 247 through the watchdog.
    for code in (0, -signal.SIGTERM, 143, 241, -signal.SIGKILL, 247):
        assert "stopped normally" in stop_message(code, stopped_here=True)
    assert "ignored SIGTERM" in stop_message(-signal.SIGKILL, stopped_here=True, killed_here=True)
    assert "already exited by itself" in stop_message(1, stopped_here=False)
