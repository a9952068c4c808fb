"""One real SGLang server across two nodes of a SLURM job (engine.sglang.nodes: 2).

The tests' cluster here has two nodes, node1 and node2, each slurmd in network, UTS and mount
namespaces of its own (tests/slurm/nodes.sh): a job's two nodes have their own hostnames, addresses
and loopbacks, as on a real cluster. A sharded category goes through the cluster profile; each
generate job asks for both nodes, runs rank 0 of the real SGLang server (CPU, tensor parallel 2
over gloo) on node1 and rank 1 with srun on node2. Rows are transformers' greedy continuation, as
in the real-SGLang tier. Faults: either rank killed mid-run, and a rank whose node lacks the model,
each end the job within a bounded time, naming the node, with no process left on either node;
the rerun resumes from the journal.
"""

import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir, demo_rows

from eagle3_datagen.storage.tables import read_rows
from polling import wait_until
from real_sglang import greedy_exact, sglang_engine
from slurm_cluster import PROFILE, holder_pid, slurm_jobs_left

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

RUN_TIMEOUT_S = 1500
CONVERSATIONS = 16
NODES = ("node1", "node2")


def two_node_engine(model_dir) -> dict:
    """The real server on CPU across two nodes: tensor parallel 2, one rank a node, each rank's
    OpenMP threads on core 0 of its node (SGLang reads the |-separated list by the rank's place on
    its node; unset, it refuses more ranks than NUMA nodes).
    The ranks wait engine.sglang.dist_timeout_s (600 s) for each other: rank 0 takes minutes to
    open its rendezvous on a loaded 2-core machine."""
    engine = sglang_engine(model_dir, extra=["--max-total-tokens", "2048"])
    engine["sglang"].update(tp_size=2, nodes=2)
    engine["sglang"]["env"]["SGLANG_CPU_OMP_THREADS_BIND"] = "0"
    # Every CPU of both nodes: the two shards' jobs take turns, as GPU jobs holding whole nodes do.
    engine["job"] = {"cpus": 8, "mem_mb": 4000, "runtime": 60}
    return engine


def workdir(path, model_dir, rows: int, max_new_tokens: int) -> Workdir:
    wd = Workdir(
        path,
        tokenizer=model_dir,
        model_dir=model_dir,
        backend="model",
        categories={"math": demo_rows("math", rows)},
        sheet={"math": {"shards": "2"}},
    )
    wd.config["engine"] = two_node_engine(model_dir)
    wd.set_sampling({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0})
    wd.config["model"]["context_length"] = 512
    wd.config["max_new_tokens"] = max_new_tokens
    wd.write_config()
    return wd


def run_command(wd: Workdir, *targets) -> list[str]:
    # SIGINT, not timeout's SIGTERM: on SIGINT Snakemake cancels its SLURM jobs and exits.
    return [
        "timeout", "-s", "INT", "-k", "30", str(RUN_TIMEOUT_S), *SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"),
        "--directory", str(wd.path), "--profile", str(PROFILE), *targets,
    ]  # fmt: skip


def node_processes(node: str) -> dict[int, str]:
    """The processes running on a test node (its network namespace), but its slurmd, by pid."""
    pids = subprocess.run(["ip", "netns", "pids", f"e3dg-{node}"], capture_output=True, text=True).stdout.split()
    found = {}
    for pid in map(int, pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if cmd and not cmd.startswith("slurmd"):
            found[pid] = cmd
    return found


def nothing_left() -> bool:
    return not slurm_jobs_left() and not any(node_processes(node) for node in NODES)


def generate_jobs(wd: Workdir) -> dict[str, tuple[str, str]]:
    """{SLURM job id: (number of nodes, node list)} of the generate jobs of the run."""
    ids = [log.stem for log in (wd.path / ".snakemake" / "slurm_logs" / "rule_generate").rglob("*.log")]
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--jobs", ",".join(ids), "-O", "JobID:|,NumNodes:|,NodeList:"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split("|")[0].strip(): tuple(f.strip() for f in line.split("|")[1:]) for line in out.splitlines()}


@pytest.fixture(scope="module")
def two_node_run(two_node_cluster, tmp_path_factory, demo_model_dir):
    wd = workdir(tmp_path_factory.mktemp("multinode"), demo_model_dir, rows=CONVERSATIONS, max_new_tokens=16)
    start = time.monotonic()
    proc = subprocess.run(run_command(wd, "results/dataset/math.jsonl"), capture_output=True, text=True, env=wd.env())
    elapsed = time.monotonic() - start
    print(f"a sharded category through two-node servers: {elapsed:.0f} s")
    assert proc.returncode == 0, f"failed after {elapsed:.0f} s:\n{proc.stdout[-4000:]}\n{proc.stderr[-12000:]}"
    return wd


def assert_every_turn_once(rows: list[dict], demo_model_dir) -> None:
    """Every conversation (one demo row has no id: it gets its content's hash), every turn of each, the
    answers greedy-exact: the tiny model's greedy answers may loop or fill their budget, and a
    conversation's later turns are then skipped rows saying why."""
    assert len({r["id"] for r in rows}) == CONVERSATIONS
    assert all(r["status"] == "ok" or (r["status"] == "skipped" and r["error"]) for r in rows), rows
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= CONVERSATIONS and sum(greedy_exact(rows, demo_model_dir).values()) == len(ok)


def test_each_shard_is_one_server_on_two_nodes_and_its_rows_are_greedy_exact(two_node_run, demo_model_dir):
    wd = two_node_run
    jobs = generate_jobs(wd)
    assert len(jobs) == 2 and all(v == ("2", "node[1-2]") for v in jobs.values()), jobs  # one job per shard
    for shard in (0, 1):
        job_log = (wd.path / "logs" / "generate" / "math" / f"shard_{shard}.log").read_text()
        assert "rank 0 on node1 (this node), rank 1 on node2; they meet at node1:" in job_log, job_log[-3000:]
        (rank1,) = (wd.path / "logs" / "generate" / "math" / "attempts").glob(f"shard_{shard}.*.rank1.server.log")
        assert "sglang" in rank1.read_text().lower()
    rows = read_rows(wd.path / "results" / "generations" / "math.parquet")
    assert_every_turn_once(rows, demo_model_dir)
    wait_until(nothing_left, "no SLURM job and no process left on either node", timeout_s=120)


def sglang_ranks(node: str) -> list[int]:
    """The pids of the SGLang server's own processes on a node (not the watchdog, not an srun)."""
    return [
        pid
        for pid, cmd in node_processes(node).items()
        if "sglang" in cmd and "eagle3_datagen" not in cmd and not cmd.startswith("srun")
    ]


def kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def model_hidden_on(node: str, state: Path, model_dir: Path):
    """`model_dir` absent on `node` only: an empty folder mounted over its parent in that node's mount
    namespace (the one its slurmd and every step it starts live in)."""
    slurmd = (state / f"slurmd.{node}.pid").read_text().strip()
    target, empty = str(Path(model_dir).resolve().parent), state / "empty"
    empty.mkdir(exist_ok=True)
    enter = ["nsenter", f"--target={slurmd}", "--mount", "--"]
    subprocess.run([*enter, "mount", "--bind", str(empty), target], check=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", target], check=True)


def journal_rows(journal: Path, status: str | None = None) -> int:
    """Whole lines of the journal (of one status, where given)."""
    if not journal.exists():
        return 0
    lines = journal.read_bytes().splitlines(keepends=True)
    whole = [json.loads(line) for line in lines if line.endswith(b"\n")]
    return len([e for e in whole if status is None or e.get("status") == status])


# What the job's log says after each fault (None: the job was ended from outside, and says nothing).
FAULTS = {
    "rank 1 killed": "rank 1 on node node2 exited",
    "rank 0 killed": "rank 0 on node node1 died first",
    "rank 1 never up": "rank 1 on node node2 exited with code 3",
    "job cancelled": None,
    "job step killed": None,
}


def inject(fault: str, wd: Workdir, journal: Path) -> None:
    if fault == "rank 1 killed":
        kill(sglang_ranks("node2"))
    elif fault == "rank 0 killed":
        kill(sglang_ranks("node1"))
    elif fault == "job cancelled":
        subprocess.run(["scancel", *generate_jobs(wd)], check=True)
    elif fault == "job step killed":  # the generate step itself, SIGKILL: only the watchdogs and SLURM are left
        kill([holder_pid(journal)])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_rank_lost_ends_the_job_naming_its_node_and_the_rerun_resumes(
    fault, two_node_cluster, tmp_path, demo_model_dir
):
    wd = workdir(tmp_path / "wd", demo_model_dir, rows=CONVERSATIONS, max_new_tokens=96)
    (wd.path / "config" / "categories.tsv").write_text("category\tprompts\nmath\tconfig/prompts/math.jsonl\n")
    journal = wd.path / "cache" / "journal" / "math" / "shard_0-of-1.jsonl"
    target = "results/dataset/math.jsonl"
    hidden = model_hidden_on("node2", two_node_cluster, demo_model_dir) if fault == "rank 1 never up" else nullcontext()
    with hidden, open(tmp_path / "failed.log", "w") as out:
        proc = subprocess.Popen(run_command(wd, target), stdout=out, stderr=subprocess.STDOUT, env=wd.env())
        if fault != "rank 1 never up":
            wait_until(lambda: journal_rows(journal) >= 1, "a first row journalled", timeout_s=900, process=proc)
        injected = time.monotonic()
        inject(fault, wd, journal)
        proc.wait(timeout=RUN_TIMEOUT_S)
    ended_s = time.monotonic() - injected
    assert proc.returncode != 0, (tmp_path / "failed.log").read_text()[-3000:]
    assert ended_s < 300, f"the job ended {ended_s:.0f} s after the fault"
    job_log = (wd.path / "logs" / "generate" / "math" / "shard_0.log").read_text()
    if FAULTS[fault]:
        assert FAULTS[fault] in job_log and "its last lines:" in job_log, job_log[-4000:]
    if fault == "rank 1 never up":
        assert "demo_model does not exist" in job_log, job_log[-4000:]
    wait_until(nothing_left, "no SLURM job and no process left on either node", timeout_s=180)

    done = journal_rows(journal, "ok")
    rerun = subprocess.run(run_command(wd, target), capture_output=True, text=True, env=wd.env())
    assert rerun.returncode == 0, rerun.stderr[-8000:]
    log_lines = (wd.path / "logs" / "generate" / "math" / "shard_0.log").read_text().splitlines()
    plan = [line for line in log_lines if " plan: " in line][-1]
    assert f"'reused': {done}," in plan, plan  # the rerun sends only what the journal lacks
    rows = read_rows(wd.path / "results" / "generations" / "math.parquet")
    assert_every_turn_once(rows, demo_model_dir)
    wait_until(nothing_left, "no SLURM job and no process left on either node", timeout_s=180)
