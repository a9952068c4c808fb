"""`status` from another process while the real workflow runs: a generate job in flight, the same
job killed with SIGKILL (Snakemake and all), and the rerun that finishes it."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir

from polling import wait_until

pytestmark = pytest.mark.slow

REACH_S = 600


def prompts(n):
    return [{"id": f"w-{i:03d}", "messages": [{"role": "user", "content": f"What is {i} plus {i}?"}]} for i in range(n)]


def status(wd, *args):
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen", "status", "--directory", str(wd.path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def shard(wd):
    (category,) = json.loads(status(wd, "--json"))
    return category["shards"][0], category["steps"]


def journal_rows(journal):
    """Whole lines of the journal: every row the job finished (each once: one attempt per row)."""
    return sum(1 for line in journal.read_bytes().splitlines(keepends=True) if line.endswith(b"\n"))


def test_status_follows_a_job_in_flight_its_kill_and_the_rerun(tmp_path, qwen3_tokenizer_dir):
    n = 60
    wd = Workdir(
        tmp_path,
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"watch": prompts(n)},
        engine_args="--latency-ms 150:300",
        client={"concurrency": 3, "max_retries": 3, "progress_interval_s": 1},
        plain_qwen3=True,
    )
    target = "results/generations/watch.parquet"
    cmd = SNAKEMAKE + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(wd.path), "--cores", "1", target]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=wd.env()
    )
    journal = wd.path / "cache" / "journal" / "watch" / "shard_0-of-1.jsonl"
    try:
        wait_until(
            lambda: journal.exists() and journal_rows(journal) >= 10 and shard(wd)[0]["state"] == "sending",
            "the generate job journals 10 rows and status sees it sending",
            timeout_s=REACH_S,
            process=proc,
        )
        running, steps = shard(wd)
        text = status(wd)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake, the job and (by its parent watch) the engine
        proc.wait()
    assert running["planned"] == n and 10 <= running["done"] < n
    assert running["host"] == socket.gethostname() and running["limit"] == 3
    assert running["requests_per_s"] > 0 and running["eta_s"] > 0
    assert steps["merge_shards"] == "waits on generate (0 of 1 shards done)"
    line = next(line for line in text.splitlines() if line.startswith("watch"))
    assert "sending" in line and f"{running['host']} pid {running['pid']}" in line
    assert "Snakemake runs here (pid" in text.splitlines()[0]

    killed, _ = shard(wd)
    assert killed["state"] == "killed"
    assert killed["done"] == journal_rows(journal)  # the rows journalled after the last publish too
    after_kill = status(wd)
    assert "rerun to resume" in after_kill and "Snakemake's lock is left by a run that is gone" in after_kill

    wd.snakemake("--unlock")
    wd.snakemake("--cores", "1", "--rerun-incomplete", target)
    done, steps = shard(wd)
    assert (done["state"], done["done"], done["planned"], done["failed"]) == ("done", n, n, 0)
    assert steps["merge_shards"] == "done" and steps["check_sequences"] == "to run"
