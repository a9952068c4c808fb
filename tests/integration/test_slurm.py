"""The workflow on a real SLURM cluster: a single node on localhost with fake GPUs.

tests/slurm/start_slurm.sh starts munged, slurmctld and slurmd (Debian's packages, installed by
tests/slurm/install_slurm.sh when missing), and the workflow runs through the test cluster profile
tests/slurm/profile with snakemake-executor-plugin-slurm: the generate jobs are submitted with
sbatch, ask for a GPU and get one; the other rules run on the submitting host.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir

from polling import wait_until
from slurm_cluster import PROFILE, ended, holder_pid, slurm_jobs_left, squeue

pytestmark = pytest.mark.slow

# The limit of one run through the cluster: about 40 s here, several times that on a loaded machine,
# whose every job the plugin's status checks (2 s, then 10 s more each time none has finished) find
# later still. Generous: past it the run is stopped, and its output is the failure.
RUN_TIMEOUT_S = 900
CATEGORIES = {"alpha": 6, "beta": 5}


def prompts(category, n):
    return [
        {
            "id": f"{category}-{i:03d}",
            "messages": [{"role": "user", "content": f"{category} question {i}: what is {i} plus {i + 2}?"}],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory, qwen3_tokenizer_dir):
    """The workflow run once through the test cluster profile, less its slurm-status-command line
    (so the run must find for itself that sacct cannot answer here; the profile as it is, squeue
    named, runs the orphan test's jobs): (workdir, snakemake process, seconds)."""
    wd = Workdir(
        tmp_path_factory.mktemp("slurm_run"),
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={name: prompts(name, n) for name, n in CATEGORIES.items()},
    )
    # The plain Qwen3 template: no <think> suffix, and <think> may be generated; one mode.
    wd.one_mode()
    wd.config["model"].update(
        prompt_suffix=[],
        prompt_only_tokens=[],
        stop_tokens=["<|im_end|>"],
        chat_template_kwargs={},
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
    )
    # One GPU per generate job, so that SLURM's GPU allocation is exercised; small CPU and memory.
    wd.config["engine"]["local"]["gpus"] = 1
    wd.config["engine"]["job"] = {"cpus": 1, "mem_mb": 1000, "runtime": 10}
    wd.write_config()
    profile = profile_without_status_command(tmp_path_factory.mktemp("slurm_profile") / "profile")
    # SIGINT, not timeout's SIGTERM: on SIGINT Snakemake cancels its SLURM jobs and exits.
    cmd = [
        "timeout",
        "-s",
        "INT",
        "-k",
        "30",
        str(RUN_TIMEOUT_S),
        *SNAKEMAKE,
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(wd.path),
        "--profile",
        str(profile),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=wd.env())
    elapsed = time.monotonic() - start
    print(f"workflow through SLURM: {elapsed:.1f} s")
    assert proc.returncode == 0, (
        f"snakemake --profile {profile} failed ({proc.returncode}) after {elapsed:.0f} s:\n{proc.stdout[-4000:]}\n{proc.stderr[-10000:]}"
    )
    return wd, proc, elapsed


def generate_job_logs(wd):
    logs = sorted((wd.path / ".snakemake" / "slurm_logs" / "rule_generate").rglob("*.log"))
    return {log.stem: log for log in logs}


def test_generate_jobs_run_as_slurm_jobs_with_a_gpu(slurm_run):
    from eagle3_datagen.storage.tables import read_provenance

    wd, proc, _ = slurm_run
    logs = generate_job_logs(wd)
    assert len(logs) == len(CATEGORIES), f"SLURM logs of generate: {sorted(map(str, logs.values()))}"
    assert all(job_id.isdigit() for job_id in logs)
    # The plugin writes rule_generate/<wildcards: category and shard>/<SLURM job id>.log.
    assert sorted(next(c for c in CATEGORIES if log.parent.name.startswith(c)) for log in logs.values()) == sorted(
        CATEGORIES
    )

    # Only generate went to the cluster; every other rule ran on the submitting host.
    slurm_logs = wd.path / ".snakemake" / "slurm_logs"
    assert {p.name for p in slurm_logs.iterdir()} == {"rule_generate"}

    jobs = squeue(list(logs))
    assert set(jobs) == set(logs), jobs
    names = set()
    for job_id, (state, name, tres) in jobs.items():
        assert state == "COMPLETED", (job_id, state)
        assert re.fullmatch(r"gres[:/]gpu:1", tres), (job_id, tres)  # sbatch --gpus=1
        names.add(name)
    assert len(names) == 1  # one Snakemake run: the plugin names every job after the run

    seen = {}
    for category in CATEGORIES:
        facts = read_provenance(wd.path / "results" / "generations" / f"{category}.parquet")["job"]
        assert facts["slurm_job_id"] in logs, (category, facts, sorted(logs))
        # SLURM gave the job one of the node's two fake GPUs.
        assert facts["cuda_visible_devices"] in {"0", "1"}, (category, facts)
        assert facts["host"]
        assert logs[facts["slurm_job_id"]].parent.name == f"{category}_0"  # wildcards: category, shard
        seen[category] = facts["slurm_job_id"]
        # The job's SLURM log holds the inner Snakemake's run of this category's generate.
        assert f"results/generations/{category}/shard_0.parquet" in logs[facts["slurm_job_id"]].read_text()
    assert len(set(seen.values())) == len(CATEGORIES)

    # status, from the submitting host, names each shard's SLURM job and the node it ran on.
    said = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen", "status", "--directory", str(wd.path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    for category in json.loads(said.stdout):
        (shard,) = category["shards"]
        facts = read_provenance(wd.path / "results" / "generations" / f"{category['category']}.parquet")["job"]
        assert shard["state"] == "done" and shard["done"] == shard["planned"] > 0, category
        assert (shard["slurm_job_id"], shard["host"]) == (seen[category["category"]], facts["host"]), category


def test_outputs_hold_every_row(slurm_run):
    wd, _, _ = slurm_run
    merged = wd.jsonl("results/train/train.jsonl")
    for category, n in CATEGORIES.items():
        rows = wd.jsonl(f"results/dataset/{category}.jsonl")
        assert sorted((r["id"], r["sample_index"]) for r in rows) == [(f"{category}-{i:03d}", 0) for i in range(n)]
        assert all(r["category"] == category for r in rows)
        assert all(
            len(r["input_ids"]) == len(r["loss_mask"]) == r["n_prompt_tokens"] + r["n_output_tokens"] for r in rows
        )
        assert all(sum(r["loss_mask"]) == r["n_output_tokens"] > 0 for r in rows)
        assert wd.jsonl(f"results/rejected/{category}.jsonl") == []
        assert (wd.path / "results" / "checks" / f"{category}.json").exists()
    assert len(merged) == sum(CATEGORIES.values())
    assert (wd.path / "results" / "summary.tsv").exists()


def test_a_second_run_through_the_profile_has_nothing_to_do(slurm_run):
    wd, _, _ = slurm_run
    before = set(generate_job_logs(wd))
    proc = wd.snakemake("--profile", str(PROFILE), "--dry-run", timeout=RUN_TIMEOUT_S)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert set(generate_job_logs(wd)) == before


def test_after_rm_results_no_slurm_job_is_submitted_and_the_dataset_is_the_same(slurm_run):
    """Every shard's plan sends nothing: each is assembled from the journal on the submitting host."""
    wd, _, _ = slurm_run
    before = set(generate_job_logs(wd))
    served = len(wd.engine_record())
    assert served == sum(CATEGORIES.values())
    dataset = {c: (wd.path / "results" / "dataset" / f"{c}.jsonl").read_bytes() for c in CATEGORIES}
    shutil.rmtree(wd.path / "results")
    datasets = [f"results/dataset/{c}.jsonl" for c in CATEGORIES]  # what this test reads
    wd.snakemake("--profile", str(PROFILE), *datasets, timeout=RUN_TIMEOUT_S)
    assert set(generate_job_logs(wd)) == before  # no generate job went to SLURM
    assert {p.name for p in (wd.path / ".snakemake" / "slurm_logs").iterdir()} == {"rule_generate"}
    assert len(wd.engine_record()) == served  # and no request was sent
    assert {c: (wd.path / "results" / "dataset" / f"{c}.jsonl").read_bytes() for c in CATEGORIES} == dataset
    for category in CATEGORIES:
        assert (wd.path / "results" / "generations" / category / "shard_0.cached.parquet").exists()


def profile_without_status_command(path, *extra):
    """The test profile without its slurm-status-command line (the plugin then picks sacct), plus `extra` lines."""
    path.mkdir()
    text = (PROFILE / "config.yaml").read_text()
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith(("slurm-status-command", *[e.split(":")[0] for e in extra]))
    ]
    (path / "config.yaml").write_text("\n".join(lines + list(extra)) + "\n")
    return path


def small_run(path, qwen3_tokenizer_dir):
    wd = Workdir(
        path,
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"alpha": prompts("alpha", 2)},
        plain_qwen3=True,
    )
    wd.config["engine"]["job"] = {"cpus": 1, "mem_mb": 1000, "runtime": 10}
    wd.write_config()
    return wd


def run_profile(wd, profile, limit_s):
    cmd = ["timeout", "-s", "INT", "-k", "10", str(limit_s), *SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile")]
    start = time.monotonic()
    proc = subprocess.run(
        cmd + ["--directory", str(wd.path), "--profile", str(profile)], capture_output=True, text=True
    )
    return proc, time.monotonic() - start


def test_without_accounting_a_profile_that_names_no_status_command_still_finishes(slurm_run):
    """The test cluster has no accounting database: the plugin's default (sacct) cannot work, so the
    run (slurm_run's, through a profile naming no status command) reads job states with squeue, says
    so, and finishes: its SLURM jobs were seen to end."""
    _, proc, _ = slurm_run
    said = proc.stdout + proc.stderr
    assert "job states are read with squeue" in said and "accounting storage is disabled" in said


def test_a_profile_whose_job_states_cannot_be_read_fails_fast(slurm_cluster, tmp_path, qwen3_tokenizer_dir):
    """No accounting, and finished jobs vanish from squeue before the first check (MinJobAge 600 s
    against 3 x 300 s): refused at once with what to change, and nothing is submitted. (Stopped
    before the 300 s a first status check would have waited: 124 would be the timeout's code.)"""
    wd = small_run(tmp_path / "run", qwen3_tokenizer_dir)
    profile = profile_without_status_command(tmp_path / "profile", "slurm-init-seconds-before-status-checks: 300")
    proc, elapsed = run_profile(wd, profile, 280)
    said = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 124), (proc.returncode, elapsed, said[-3000:])
    assert "MinJobAge = 600 s" in said and "slurm-init-seconds-before-status-checks to 200" in said, said[-3000:]
    assert not (wd.path / ".snakemake" / "slurm_logs").exists()  # no job was submitted
    assert not (wd.path / "results" / "prompts").exists()  # nor anything run


def test_a_killed_snakemakes_orphan_and_its_twin_never_send_the_same_row(slurm_cluster, tmp_path, qwen3_tokenizer_dir):
    """kill -9 of Snakemake mid-run: its generate job runs on as an orphan; the rerun's twin job for
    the same shard refuses while the orphan holds the journal; once it is done, a rerun finishes.
    The orphan is held (SIGSTOP) from the kill until the twin has refused, so that the twin always
    meets it, however long the twin takes to start; its requests wait without timing out. The twin's
    Snakemake is stopped once SLURM has its job as failed: by itself it would see that only at its
    next status check, and wait out one more before exiting."""
    import signal

    from eagle3_datagen.generation.requests import parse_rid

    n = 40
    wd = Workdir(
        tmp_path / "run",
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"orphan": prompts("orphan", n)},
        plain_qwen3=True,
        engine_args="--latency-ms 300:600",
        client={"concurrency": 2, "max_retries": 3, "progress_interval_s": 1, "request_timeout_floor_s": 3600},
    )
    wd.config["engine"]["local"]["gpus"] = 1
    wd.config["engine"]["job"] = {"cpus": 1, "mem_mb": 1000, "runtime": 60}
    wd.write_config()
    journal = wd.path / "cache" / "journal" / "orphan" / "shard_0-of-1.jsonl"
    attempts = wd.path / "logs" / "generate" / "orphan" / "attempts"
    target = "results/generations/orphan.parquet"
    cmd = SNAKEMAKE + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(wd.path), "--profile", str(PROFILE)]
    with open(tmp_path / "killed.log", "w") as out:
        proc = subprocess.Popen(cmd + [target], stdout=out, stderr=subprocess.STDOUT, env=wd.env())
    try:
        wait_until(
            lambda: journal.exists() and len(journal.read_bytes().splitlines()) >= 5 and holder_pid(journal),
            f"the first run's generate job journals 5 rows (its output: {tmp_path / 'killed.log'})",
            timeout_s=RUN_TIMEOUT_S,
            process=proc,
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # Snakemake only: its SLURM job runs on, an orphan
        proc.wait()
    orphan = holder_pid(journal)
    os.kill(orphan, signal.SIGSTOP)
    try:
        assert len(journal.read_bytes().splitlines()) < n, "the orphan finished before the twin could meet it"
        wd.snakemake("--unlock")
        with open(tmp_path / "twin.log", "w") as out:
            twin = subprocess.Popen(cmd + [target], stdout=out, stderr=subprocess.STDOUT, env=wd.env())
        refused = wait_until(
            lambda: [p for p in attempts.glob("*.log") if "another generate job holds the journal" in p.read_text()],
            f"the twin's generate job refuses (the twin's output: {tmp_path / 'twin.log'})",
            timeout_s=RUN_TIMEOUT_S,
            process=twin,
        )
    finally:
        os.kill(orphan, signal.SIGCONT)
    assert f"pid {orphan}" in refused[0].read_text() and "SLURM job" in refused[0].read_text()
    twin_job = re.search(r"\.slurm(\d+)", refused[0].name).group(1)
    try:
        state = wait_until(
            lambda: ended(squeue([twin_job])[twin_job][0]), "the twin's SLURM job ends", timeout_s=RUN_TIMEOUT_S
        )
    finally:
        twin.kill()
        twin.wait()
    assert state == "FAILED", state
    wd.snakemake("--unlock")
    wait_until(lambda: not slurm_jobs_left(), "the orphan's SLURM job ends", timeout_s=RUN_TIMEOUT_S, interval_s=0.5)
    final = wd.snakemake("--profile", str(PROFILE), target, check=False, timeout=RUN_TIMEOUT_S)
    logs = {p.name: p.read_text()[-1500:] for p in sorted(attempts.glob("*.log"))}
    assert final.returncode == 0, (final.stderr[-3000:], logs)

    from eagle3_datagen.storage.tables import read_rows

    rows = read_rows(wd.path / target)
    assert sorted(r["id"] for r in rows) == [f"orphan-{i:03d}" for i in range(n)]
    assert all(r["status"] == "ok" for r in rows)
    served = [parse_rid(e["rid"])[0] for e in wd.engine_record("orphan") if e.get("status") == 200]
    assert len(served) == len(set(served)) == n  # no row was answered twice, by orphan or twin
