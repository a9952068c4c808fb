"""A server across nodes: the job's node list, the head's address, each rank's command, the resources
asked for, and refusals (the launch itself: tests/integration/test_multinode.py)."""

import json
import shutil
import socket

import pytest

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation import nodes
from eagle3_datagen.generation.launch import node_args
from eagle3_datagen.generation.nodes import interface_address, job_nodes, layout, main, rank_env, srun_command
from eagle3_datagen.settings import defaults
from eagle3_datagen.workflow import server_resources

needs_scontrol = pytest.mark.skipif(shutil.which("scontrol") is None, reason="SLURM's scontrol is not installed")


@pytest.fixture(autouse=True)
def no_cluster(tmp_path, monkeypatch):
    """scontrol expands node lists by itself, but reads a SLURM config first: a minimal one of its own,
    so these tests neither need a cluster's config nor see one that a test cluster left running. No
    controller answers here (the two-node tests ask a real one for a job's node list)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nodelists\nSlurmctldHost=localhost\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(nodes, "job_nodelist", lambda job: None)


def engine(**sglang) -> EngineSettings:
    block = {"python": "/envs/sglang/bin/python", "model_path": "/models/kimi", "tp_size": 16, "nodes": 2, **sglang}
    return EngineSettings.from_config({"kind": "sglang", "sglang": block})


@needs_scontrol
@pytest.mark.parametrize(
    "nodelist, names",
    [
        ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("n[1,3-4],gpu007", ["n1", "n3", "n4", "gpu007"]),
        ("node1", ["node1"]),
    ],
)
def test_node_lists_expand_as_slurm_expands_them(nodelist, names):
    assert job_nodes(nodelist) == names


@needs_scontrol
def test_the_head_is_this_node_and_the_others_follow_in_the_job_order():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURMD_NODENAME": "gpu02"}
    where = layout(engine(tp_size=24, nodes=3).server, env)
    assert (where.head, where.others) == ("gpu02", ("gpu01", "gpu03"))
    host, port = where.dist_init_addr.rsplit(":", 1)
    assert host == "gpu02" and 1024 <= int(port) < 65536
    with pytest.raises(RuntimeError, match=r"holds 2 node\(s\) \(a\[1-2\]\)"):
        layout(engine(tp_size=24, nodes=3).server, {**env, "SLURM_JOB_NODELIST": "a[1-2]", "SLURMD_NODENAME": "a1"})
    with pytest.raises(RuntimeError, match="this step runs on b9"):
        layout(engine().server, {**env, "SLURMD_NODENAME": "b9"})


def test_a_server_across_nodes_outside_a_slurm_job_is_refused_saying_how_to_run_it():
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST is unset.*--profile slurm"):
        layout(engine().server, {})


@needs_scontrol
def test_the_dist_init_interface_gives_the_heads_address_on_that_network():
    loopback = next(name for _, name in socket.if_nameindex() if name.startswith("lo"))
    assert interface_address(loopback) == "127.0.0.1"
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-2]", "SLURMD_NODENAME": "h1"}
    assert layout(engine(dist_init_interface=loopback).server, env).dist_init_addr.startswith("127.0.0.1:")
    with pytest.raises(RuntimeError, match="'ib9' has no IPv4 address.*its interfaces: .*lo"):
        interface_address("ib9")


def test_each_rank_gets_its_flags_and_an_srun_on_its_node(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    settings = engine(dist_timeout_s=90)
    assert node_args(settings, rank=1, dist_init_addr="gpu01:29500") == [
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "gpu01:29500", "--dist-timeout", "90",
    ]  # fmt: skip
    assert "--dist-timeout" not in node_args(engine(dist_timeout_s=None), rank=0, dist_init_addr="h:1")
    cmd = srun_command(settings.server, "gpu02", cpus=16, cmd=["python", "-m", "sglang.launch_server"])
    assert cmd[:9] == [
        "srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu02", "--cpus-per-task=16",
        "--mem=0", "--gres=gpu:8",
    ]  # fmt: skip
    assert cmd[-3:] == ["python", "-m", "sglang.launch_server"]
    env = rank_env({"SLURM_JOB_ID": "42", "SLURM_STEP_NODELIST": "gpu01", "CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/h"})
    assert env["SLURM_JOB_ID"] == "42" and env["HF_HOME"] == "/h"
    assert "SLURM_STEP_NODELIST" not in env and "CUDA_VISIBLE_DEVICES" not in env  # the head step's, not the rank's


def test_a_rank_refuses_to_start_on_a_node_without_the_model_or_the_gpus(tmp_path, capsys, monkeypatch):
    checks = {"model_path": str(tmp_path / "absent"), "tp_size": 16, "nodes": 2, "extra_args": []}
    assert main(["--checks", json.dumps(checks), "--", "true"]) == 3
    assert "absent" in capsys.readouterr().err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    checks["model_path"] = str(tmp_path)
    assert main(["--checks", json.dumps(checks), "--", "true"]) == 3
    assert "needs 8 GPUs on this node" in capsys.readouterr().err


def test_a_job_asks_for_the_nodes_and_the_gpus_of_each(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"to_send": 5}))
    block = defaults("engine", kind="sglang", sglang={"model_path": "/m", "tp_size": 16, "nodes": 2})
    assert server_resources(block, plan) == {"gpu": 0, "gres": "gpu:8", "nodes": 2}
    assert server_resources(defaults("engine", kind="sglang", sglang={"model_path": "/m", "tp_size": 8}), plan) == {
        "gpu": 8,
        "gres": "",
        "nodes": 1,
    }
    plan.write_text(json.dumps({"to_send": 0}))
    assert server_resources(block, plan) == {"gpu": 0, "gres": "", "nodes": 1}


def test_node_flags_in_extra_args_and_uneven_nodes_are_refused():
    with pytest.raises(ValueError, match="--nnodes: the job sets these for each rank; give .* engine.sglang.nodes"):
        engine(nodes=1, extra_args=["--nnodes", "2"])
    with pytest.raises(ValueError, match="--node-r=1: the job sets these"):  # a prefix SGLang takes
        engine(nodes=1, extra_args=["--node-r=1"])
    with pytest.raises(ValueError, match="tp_size 16 is not a multiple of engine.sglang.nodes 3"):
        engine(nodes=3)


GLOO_PEER_LOST = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4002: "
    "Connection reset by peer. This is typically caused by a remote worker hanging"
)


def watched_ranks(tmp_path, logs: dict[int, str], seen_dead: dict[int, float]) -> nodes.Ranks:
    """Ranks 0..N with these logs, each seen dead at the given time (absent: still running)."""
    import subprocess
    import types

    ranks = []
    for i in sorted(logs):
        path = tmp_path / f"rank{i}.log"
        path.write_text(logs[i])
        if i == 0:
            continue
        rank = nodes.Rank(i, f"node{i + 1}", [], path, {})
        rank.proc = subprocess.Popen(["true"] if i in seen_dead else ["sleep", "60"])
        if i in seen_dead:
            rank.proc.wait()
            rank.exited_at = seen_dead[i]
        ranks.append(rank)
    watched = nodes.Ranks(ranks, "node1", ())
    watched.head = types.SimpleNamespace(log_path=tmp_path / "rank0.log")
    watched.head_exited_at = seen_dead.get(0)
    return watched


def stop(watched):
    for rank in watched.ranks:
        if rank.proc.poll() is None:
            rank.proc.kill()
            rank.proc.wait()


@pytest.mark.parametrize(
    "seen_dead, first",
    [
        ({0: 10.0, 1: 10.0}, "rank 0 on node node1 died first"),  # one poll saw both
        ({0: 10.5, 1: 10.0}, "rank 0 on node node1 died first"),  # rank 1's death was seen earlier
    ],
)
def test_the_rank_named_first_is_the_one_that_did_not_lose_a_peer(tmp_path, seen_dead, first):
    watched = watched_ranks(tmp_path, {0: "serving\n", 1: f"decoding\n{GLOO_PEER_LOST}\n"}, seen_dead)
    try:
        death = watched.first_death()
        assert death.startswith(first), death
        assert "its last lines:\nserving" in death
    finally:
        stop(watched)


def test_where_every_dead_rank_lost_a_peer_the_first_seen_dead_is_named(tmp_path, monkeypatch):
    """A network fault: both dead ranks say they lost a peer, rank 2 still runs (waited for a while)."""
    monkeypatch.setattr(nodes, "SETTLE_S", 0.3)
    watched = watched_ranks(tmp_path, {0: GLOO_PEER_LOST, 1: GLOO_PEER_LOST, 2: "serving\n"}, {0: 11.0, 1: 10.0})
    try:
        assert watched.first_death().startswith("rank 1 on node node2 exited with code 0"), watched.first_death()
    finally:
        stop(watched)


def test_a_rank_seen_dead_alone_that_lost_a_peer_waits_for_the_one_that_died_first(tmp_path, monkeypatch):
    """Rank 1 says it lost a peer and rank 0 is not yet seen dead: rank 0 is waited for, and named."""
    watched = watched_ranks(tmp_path, {0: "serving\n", 1: GLOO_PEER_LOST}, {1: 10.0})
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        watched.head_exited_at = 10.2  # the watch thread sees rank 0 dead

    monkeypatch.setattr(nodes.time, "sleep", sleep)
    try:
        assert watched.first_death().startswith("rank 0 on node node1 died first")
        assert sleeps
    finally:
        stop(watched)


def test_no_death_while_every_rank_runs(tmp_path):
    watched = watched_ranks(tmp_path, {0: "", 1: ""}, {})
    try:
        assert watched.first_death() is None
    finally:
        stop(watched)
