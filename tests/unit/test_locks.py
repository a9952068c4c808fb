"""One generate job per shard: a second job refuses, naming the holder; a dead holder's lock is taken over."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.locks import ShardBusy, ShardLock
from engine_thread import running_engine
from polling import wait_until

ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import os, sys, time
sys.path.insert(0, sys.argv[1] + "/scripts")
from eagle3_datagen.generation.locks import ShardLock
lock = ShardLock(sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def holder(journal, **env):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(ROOT), str(journal)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_job_refuses_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    journal = tmp_path / "cache" / "journal" / "c" / "shard_0-of-1.jsonl"
    proc = holder(journal, SLURM_JOB_ID="4242")
    try:
        with pytest.raises(ShardBusy) as busy:
            ShardLock(journal).acquire()
        message = str(busy.value)
        assert str(journal) in message and f"pid {proc.pid}" in message and "SLURM job 4242" in message
        assert "scancel 4242" in message and os.uname().nodename in message
    finally:
        proc.send_signal(signal.SIGKILL)  # the holder dies without cleaning up
        proc.wait()
    with ShardLock(journal) as lock:  # its lock died with it
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    with ShardLock(journal):  # and a released lock is free again
        pass


GENERATE = """
import json, sys
sys.path.insert(0, sys.argv[1] + "/scripts")
from eagle3_datagen.steps.generate import generate
args = json.loads(sys.argv[2])
try:
    generate(**args)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    sys.exit(3)
print(json.dumps({"ok": True}))
"""


def test_two_jobs_for_one_shard_started_together_send_each_row_once(make_prompts, qwen3_tokenizer_dir, tmp_path):
    """The first job is held (SIGSTOP) once it has journalled a row, until the second has ended: the
    second always meets it mid-run, however slowly either starts; the first's requests wait for it."""
    from eagle3_datagen.engine.server import Faults
    from eagle3_datagen.settings import defaults
    from eagle3_datagen.storage.tables import read_rows

    prompts, model = make_prompts(conversations(40))
    record = tmp_path / "record.jsonl"
    faults = Faults(latency_ms=(50, 100), seed=0)  # the first job sends for a second or two
    journal = tmp_path / "cache" / "journal" / "cat" / "shard_0-of-1.jsonl"
    with running_engine(ScriptedBackend(str(qwen3_tokenizer_dir)), faults=faults, record=record) as url:
        procs = []
        for n in range(2):
            args = {
                "prompts": str(prompts),
                "shard_generations": str(tmp_path / f"out{n}.parquet"),
                "server_log": str(tmp_path / f"server{n}.log"),
                "category": "cat",
                "shard": 0,
                "model": model,
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
                "engine": defaults("engine", kind="external", external={"urls": [url]}),
                "budget": {"max_new_tokens": 32, "min_new_tokens": 4, "reserve_tokens": 2},
                "client": {"concurrency": 2, "request_timeout_floor_s": 3600},
                "max_failed_share": 0.0,
                "cache_dir": str(tmp_path / "cache"),
                "shards": 1,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", GENERATE, str(ROOT), json.dumps(args)], stdout=subprocess.PIPE, text=True
                )
            )
            if n == 0:
                # The second starts while the first is sending (it has journalled a row): a twin, not a rerun.
                wait_until(
                    lambda: journal.exists() and journal.stat().st_size,
                    "the first job journals a row",
                    timeout_s=300,
                    process=procs[0],
                )
                os.kill(procs[0].pid, signal.SIGSTOP)
        try:
            second = procs[1].communicate(timeout=300)[0]
        finally:
            os.kill(procs[0].pid, signal.SIGCONT)
        first = procs[0].communicate(timeout=300)[0]
        outcomes = [
            (proc.returncode, json.loads(out.strip().splitlines()[-1])) for proc, out in zip(procs, (first, second))
        ]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 3], outcomes  # exactly one ran, the other refused
    refused = next(o for code, o in outcomes if code == 3)
    assert refused["error"] == "ShardBusy" and "another generate job holds the journal" in refused["message"]
    served = [json.loads(line) for line in record.read_text().splitlines()]
    keys = [e["rid"].rsplit(".", 2)[0] for e in served]
    assert len(keys) == len(set(keys)) == 40  # every row sent once, by the one job
    winner = next(n for n, (code, _) in enumerate(outcomes) if code == 0)
    assert len(read_rows(tmp_path / f"out{winner}.parquet")) == 40
    assert not (tmp_path / f"out{1 - winner}.parquet").exists()
