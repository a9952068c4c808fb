"""Launch commands, refused flags, secrets kept out of logs and provenance, GPU requests."""

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation.launch import local_engine_command, server_env, sglang_command
from eagle3_datagen.generation.nodes import srun_command
from eagle3_datagen.generation.redact import is_secret_name, redact, redact_command
from eagle3_datagen.generation.servers import _managed_server, servers
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.steps.headline import job_usage
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
    "flag",
    ["--reasoning-parser", "--tool-call-parser=kimi_k2", "--allow-auto-truncate", "--skip-tokenizer-init"]
    + ["--reasoning-pars", "--tool-call=kimi_k2", "--allow-auto"],  # prefixes SGLang takes for them
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
    assert server_resources(SGLANG, plan)["gpu"] == 16  # tp_size 8 × --dp 2: two replicas of 8 GPUs
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


def sglang_engine(tp_size=8, nodes=1, extra=()):
    return defaults(
        "engine",
        kind="sglang",
        sglang={"model_path": "/m", "tp_size": tp_size, "nodes": nodes, "extra_args": list(extra)},
    )


@pytest.mark.parametrize(
    "tp_size, nodes, extra, per_node",
    [
        (8, 1, [], 8),
        (8, 1, ["--dp", "2"], 16),
        (8, 1, ["--dp-size=2"], 16),
        (8, 1, ["--data-parallel-size", "3"], 24),
        (4, 1, ["--pp-size", "2"], 8),
        (4, 1, ["--pipeline-parallel-size=2", "--dp-size", "2"], 16),
        (4, 1, ["--pipeline-parallel", "2"], 8),  # a prefix SGLang's parser takes
        (8, 1, ["--dp-size", "8", "--enable-dp-attention"], 8),  # dp ranks share the tp GPUs
        (8, 1, ["--served-model-name", "dp", "--dp", "2"], 16),  # a value that is a key's name is a value
        (8, 1, ["--dp", "2", "--dp", "4"], 32),  # the last one wins, as in argparse
        (16, 2, [], 8),
        (8, 2, ["--pp-size", "2"], 8),  # one stage on each node
        (4, 4, ["--pp-size", "2"], 2),  # each stage on two nodes
        (2, 2, ["--pp-size", "4"], 4),  # two stages on each node
        (16, 2, ["--dp-size", "2", "--enable-dp-attention"], 8),
    ],
)
def test_every_gpu_count_follows_tp_pp_and_dp_replicas_per_node(tmp_path, monkeypatch, tp_size, nodes, extra, per_node):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"to_send": 5}))
    engine = sglang_engine(tp_size, nodes, extra)
    settings = EngineSettings.from_config(engine)
    assert settings.gpus == settings.server.gpus == per_node and settings.all_gpus == per_node * nodes
    wanted = (
        {"gpu": per_node, "gres": "", "nodes": 1}
        if nodes == 1
        else {"gpu": 0, "gres": f"gpu:{per_node}", "nodes": nodes}
    )
    assert server_resources(engine, plan) == wanted
    shard = {"client": {"requests": 1}, "params": {"engine": engine}, "job": {"wall_s": 3600}}
    assert job_usage(shard)["gpu_hours"] == per_node * nodes  # the headline's and provenance's GPU-hours
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    assert f"--gres=gpu:{per_node}" in srun_command(settings.server, "n2", cpus=1, cmd=["python"])  # another rank's


@pytest.mark.parametrize(
    "tp_size, nodes, extra, refused",
    [
        (8, 1, ["--tp", "4"], "--tp: the tensor-parallel size is engine.sglang.tp_size"),
        (8, 1, ["--tp-size=8"], "--tp-size=8: the tensor-parallel size is engine.sglang.tp_size"),
        (8, 1, ["--tensor-parallel-size", "8"], "engine.sglang.tp_size"),
        (8, 1, ["--pp", "2"], "--pp is ambiguous to SGLang .*--pp-size.*write it whole"),
        (8, 1, ["--dp-size", "two"], "--dp-size 'two' is not a positive whole number"),
        (8, 1, ["--dp-size", "²"], "--dp-size '²' is not a positive whole number"),
        # Every prefix of --enable-dp-attention is one of a longer flag too: SGLang refuses them all.
        (8, 1, ["--enable-dp-att", "--dp", "2"], "--enable-dp-att is ambiguous to SGLang"),
        (8, 1, ["--pipeline-parallel-size=0"], "--pp-size '0' is not a positive whole number"),
        (16, 2, ["--dp", "2"], "data-parallel size 2 with engine.sglang.nodes 2: SGLang cannot place"),
        (4, 3, ["--pp-size", "2"], "tp_size 4 × pipeline-parallel size 2 is not a multiple of engine.sglang.nodes 3"),
        (2, 2, ["--pp-size", "3"], "pipeline-parallel size 3 cannot be laid out on engine.sglang.nodes 2"),
    ],
)
def test_parallel_flags_that_would_miscount_the_gpus_are_refused(tp_size, nodes, extra, refused):
    with pytest.raises(ValueError, match=refused):
        check_engine(sglang_engine(tp_size, nodes, extra))
    with pytest.raises(ValueError, match="engine.sglang"):
        sglang_command(sglang_engine(tp_size, nodes, extra), port=1, context_length=10)


def test_pp_neighbours_and_other_flags_are_not_counted():
    settings = EngineSettings.from_config(
        sglang_engine(8, 1, ["--pp-max-micro-batch-size", "4", "--pp-async-batch-depth=2", "--enable-metrics"])
    )
    assert settings.gpus == 8


@pytest.mark.parametrize(
    "extra, listens, reached",
    [
        ([], "127.0.0.1", "http://127.0.0.1:31234"),
        (["--host", "0.0.0.0"], "0.0.0.0", "http://127.0.0.1:31234"),
        (["--host="], "", "http://127.0.0.1:31234"),
        (["--host", "::"], "::", "http://[::1]:31234"),
        (["--host=10.1.2.3", "--enable-metrics"], "10.1.2.3", "http://10.1.2.3:31234"),
        (["--host", "gpu01.cluster"], "gpu01.cluster", "http://gpu01.cluster:31234"),
        (["--served-model-name", "host", "--log-level", "info"], "127.0.0.1", "http://127.0.0.1:31234"),
    ],
)
def test_the_server_listens_where_host_says_once_and_the_job_reaches_it_there(tmp_path, extra, listens, reached):
    engine = sglang_engine(8, 1, extra)
    cmd = sglang_command(engine, port=31234, context_length=10)
    hosts = [i for i, arg in enumerate(cmd) if arg.split("=")[0] == "--host"]
    assert len(hosts) == 1 and cmd[hosts[0] + 1] == listens
    profile = ModelProfile.from_config(defaults("model", name="m", tokenizer="/t", context_length=10))
    server = _managed_server(
        EngineSettings.from_config(engine), profile, port=31234, log_path=tmp_path / "s.log", key=None, streaming=False
    )
    assert server.url == reached


def test_ranks_on_other_nodes_keep_their_health_endpoint_on_localhost():
    engine = sglang_engine(16, 2, ["--host", "10.1.2.3"])
    rank = sglang_command(engine, port=5, context_length=10, host="127.0.0.1")
    assert rank.count("--host") == 1 and rank[rank.index("--host") + 1] == "127.0.0.1"


FAKE_SERVER = """
import argparse, http.server, pathlib, socket, sys
parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
pathlib.Path(sys.argv[0]).with_name("argv").write_text(repr(sys.argv[1:]))


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

class Server(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in args.host else socket.AF_INET

Server((args.host, args.port), Health).serve_forever()
"""


@pytest.mark.parametrize("host, reached", [("0.0.0.0", "127.0.0.1"), ("127.0.0.2", "127.0.0.2")])
def test_a_launched_server_is_reached_where_it_listens(tmp_path, host, reached):
    """The job's real launch path (servers, ManagedServer, the watchdog) with a stand-in `sglang.launch_server`."""
    package = tmp_path / "site" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(FAKE_SERVER)
    sglang = {
        "python": sys.executable,
        "model_path": "org/model",
        "tp_size": 1,
        "extra_args": ["--device", "cpu", "--host", host],
        "env": {"PYTHONPATH": str(tmp_path / "site")},
    }
    engine = defaults("engine", kind="sglang", startup_timeout_s=120, sglang=sglang)
    profile = ModelProfile.from_config(defaults("model", name="m", tokenizer="/t", context_length=10))
    with servers(engine, profile=profile, log_path=tmp_path / "server.log", key=None) as running:
        url = running.urls[0]
        assert url.startswith(f"http://{reached}:")
        with urllib.request.urlopen(f"{url}/health", timeout=30) as resp:
            assert resp.status == 200
    argv = (package / "argv").read_text()
    assert argv.count("'--host'") == 1 and f"'--host', '{host}'" in argv
