"""The tests' throw-away SLURM cluster (tests/slurm/*.sh) and what the tests ask it.

`running_cluster(state)` starts a single node on localhost (8 CPUs, 2 fake GPUs; munged, slurmctld,
slurmd) and stops it afterwards; `running_cluster(state, nodes=2)` starts node1 and node2 instead,
each in namespaces of its own (tests/slurm/nodes.sh). The `slurm_cluster` fixture (tests/conftest.py)
holds one for a module. There is one /etc/slurm and one set of ports per machine, so a cluster is
started only under a lock (`CLUSTER_LOCK`) held until it is stopped: test runs that need a cluster
at the same time take turns. The helpers read job states with squeue (the cluster has no accounting database) and find
the job that holds a shard's journal.
"""

import fcntl
import json
import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

SLURM_DIR = Path(__file__).resolve().parent / "slurm"
PROFILE = SLURM_DIR / "profile"
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")
CLUSTER_LOCK = Path("/run/lock/eagle3-datagen-test-slurm.lock")


@contextmanager
def cluster_lock():
    """Held while a test cluster runs on this machine (waits for another test run's cluster to stop)."""
    CLUSTER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def running_cluster(state: Path, nodes: int = 0):
    """A running cluster with its SLURM_CONF exported; always stopped afterwards: one node named
    localhost (`nodes` 0), or `nodes` nodes node1, node2, ... Installs Debian's SLURM first where it
    is missing (root only: the caller checks)."""
    if shutil.which("sinfo") is None or (nodes and shutil.which("ip") is None):
        subprocess.run(["bash", str(SLURM_DIR / "install_slurm.sh")], check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, FAKE_CPUS="8", FAKE_GPUS="2", NODES=str(nodes))
    saved = os.environ.get("SLURM_CONF")
    try:
        with cluster_lock(), _started(state, env):
            yield state
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@contextmanager
def _started(state: Path, env: dict):
    try:
        proc = subprocess.run(
            ["bash", str(SLURM_DIR / "start_slurm.sh"), str(state)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, f"start_slurm.sh failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
        exported = dict(re.findall(r"^export (\w+)=(.*)$", proc.stdout, re.MULTILINE))
        assert "SLURM_CONF" in exported, proc.stdout
        os.environ.update(exported)
        yield
    finally:
        subprocess.run(["bash", str(SLURM_DIR / "stop_slurm.sh"), str(state)], timeout=120)


def squeue(job_ids):
    """{job id: (state, job name, GPUs asked for)} of finished and running jobs (squeue --states=all)."""
    fmt = "JobID:|,State:|,Name:|,tres-per-job:"
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--jobs", ",".join(job_ids), "-O", fmt],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    jobs = {}
    for line in out.splitlines():
        job_id, state, name, tres = (field.strip() for field in line.split("|"))
        jobs[job_id] = (state, name, tres)
    return jobs


def ended(state):
    """The state of a job that has ended, or None while it is still pending or running."""
    return None if state in LIVE_STATES else state


def slurm_jobs_left():
    states = ",".join(LIVE_STATES)
    return subprocess.run(["squeue", "--noheader", f"--states={states}"], capture_output=True, text=True).stdout.strip()


def holder_pid(journal):
    """The pid of the job holding the shard's journal (written into its lock file), or None."""
    try:
        return json.loads(journal.with_name(journal.name + ".lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
