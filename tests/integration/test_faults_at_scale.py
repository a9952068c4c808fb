"""500-prompt runs through server faults and repeated SIGKILLs: every row exactly once, nothing lost,
no finished row requested again. The generate script runs directly (the engine's fast scripted backend
stands in for the GPU server)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict

import pytest
from workdir import ROOT, Workdir, row_label

from eagle3_datagen.generation.requests import parse_rid
from polling import wait_until

pytestmark = pytest.mark.slow

N = 500
TARGET = "results/generations/big/shard_0.parquet"


def prompts(n):
    return [
        {
            "id": f"row-{i:04d}",
            "messages": [
                {"role": "user", "content": f"Row {i}: explain why {i} is {'even' if i % 2 == 0 else 'odd'}."}
            ],
        }
        for i in range(n)
    ]


@pytest.fixture
def workdir(tmp_path, qwen3_tokenizer_dir):
    def make(engine_args: str, client: dict):
        wd = Workdir(
            tmp_path,
            tokenizer=qwen3_tokenizer_dir,
            model_dir=None,
            backend="scripted",
            categories={"big": prompts(N)},
            plain_qwen3=True,
            engine_args=engine_args,
        )
        wd.config["client"].update(client)
        wd.config["max_failed_share"] = 0.0
        wd.write_config()
        wd.snakemake("--cores", "1", "results/prompts/big.parquet")
        return wd

    return make


def generate_cmd(wd):
    # Run by hand: with --category, every path and param comes from the config, as the rule's would.
    return [
        sys.executable,
        "-m",
        "eagle3_datagen",
        "step",
        "generate",
        "--config",
        "config/config.yaml",
        "--category",
        "big",
    ]


def served_by_run(wd):
    runs = defaultdict(list)
    for entry in wd.engine_record("big"):
        (row_id, sample, _turn, _mode), nonce, _attempt = parse_rid(entry["rid"])
        runs[nonce].append(((row_id, sample), entry))
    return sorted(runs.values(), key=lambda entries: min(e["t_start"] for _, e in entries))


def journal_ok_keys(wd):
    keys = []
    path = wd.path / "cache" / "journal" / "big" / "shard_0-of-1.jsonl"
    if not path.exists():
        return keys
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line torn by the kill: cut off at the next start
        if entry["status"] == "ok":
            keys.append((entry["id"], entry["sample_index"]))
    return keys


def assert_complete(wd):
    from eagle3_datagen.storage.tables import read_rows

    rows = read_rows(wd.path / TARGET)
    keys = [(r["id"], r["sample_index"]) for r in rows]
    assert len(keys) == N and len(set(keys)) == N
    assert all(r["status"] == "ok" for r in rows)
    return rows


def test_5xx_resets_and_hangs_still_give_every_row_exactly_once(workdir):
    wd = workdir(
        engine_args="--error-rate 0.10 --reset-rate 0.05 --hang-rate 0.02 --seed 11",
        client={
            "concurrency": 16,
            "max_retries": 12,
            "backoff_initial_s": 0.05,
            "backoff_max_s": 0.5,
            "request_timeout_floor_s": 2,
            "request_timeout_per_token_s": 0.0,
        },
    )
    proc = subprocess.run(generate_cmd(wd), cwd=wd.path, capture_output=True, text=True, timeout=600, env=wd.env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = assert_complete(wd)
    record = wd.engine_record("big")
    faults = Counter(e.get("fault") for e in record)
    # A hang ends when the client gives up: the engine records it as the client going away (499).
    hung = sum(e["status"] == 499 for e in record)
    assert faults["error"] > 20 and faults["reset"] > 10 and hung > 3, (faults, hung)
    ok = defaultdict(list)
    for e in record:
        if e["status"] == 200:
            ok[row_label(e["rid"])].append(e)
    assert all(len(v) == 1 for v in ok.values())  # no row generated twice
    for r in rows:
        assert r["output_ids"] == ok[f"{r['id']}.{r['sample_index']}"][0]["output_ids"]
    assert max(r["attempts"] for r in rows) > 1


def test_sigkill_at_ten_random_points_loses_nothing_and_repeats_nothing(workdir, qwen3_tokenizer_dir):
    # One engine for every run, as a running (external) server: each killed job leaves it serving,
    # and each run starts in well under a second. (A launched server dying with its job is
    # tests/unit/test_servers.py's watchdog test and test_resume's kill of Snakemake.)
    wd = workdir(engine_args="", client={"concurrency": 8, "max_retries": 3, "progress_interval_s": 1})
    server = start_engine(wd, qwen3_tokenizer_dir, "--latency-ms", "100:200")
    try:
        sigkill_ten_times(wd)
    finally:
        server.terminate()
        server.wait(30)


def start_engine(wd, tokenizer, *args):
    from eagle3_datagen.generation.servers import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "eagle3_datagen.engine", "--backend", "scripted", "--model-dir", str(tokenizer)]
    cmd += ["--port", str(port), "--context-length", str(wd.config["model"]["context_length"])]
    cmd += ["--record-dir", str(wd.record_dir), *args]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")), stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    wait_until(healthy, "the engine answers /health", timeout_s=300, process=proc)
    wd.config["engine"] = {"kind": "external", "external": {"urls": [url]}}
    wd.write_config()
    return proc


def sigkill_ten_times(wd):
    rng = random.Random(20261129)
    done_before_run, run_starts = [], []
    for _ in range(10):
        done_before_run.append(set(journal_ok_keys(wd)))
        run_starts.append(time.time())
        proc = subprocess.Popen(
            generate_cmd(wd), cwd=wd.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=wd.env()
        )
        # A random point of the generation itself (start-up takes seconds): once the run has
        # journalled its first row, wait a random while, then kill.
        before = len(done_before_run[-1])
        wait_until(
            lambda before=before: len(journal_ok_keys(wd)) > before or before == N,
            "a run journals a row",
            timeout_s=300,
            interval_s=0.02,
            process=proc,
        )
        time.sleep(rng.uniform(0.0, 0.6))  # the random point: a kill, not a wait for something
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done_before_run.append(set(journal_ok_keys(wd)))
    run_starts.append(time.time())
    assert 0 < len(done_before_run[-1]) < N, "the kills did not interrupt a run in progress"
    proc = subprocess.run(generate_cmd(wd), cwd=wd.path, capture_output=True, text=True, timeout=600, env=wd.env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = assert_complete(wd)

    journal = journal_ok_keys(wd)
    assert len(journal) == len(set(journal)) == N  # each row journalled once
    served = {}
    for entry in wd.engine_record("big"):
        (row_id, sample, _turn, _mode), _nonce, _attempt = parse_rid(entry["rid"])
        key = (row_id, sample)
        run = max(i for i, t in enumerate(run_starts) if t <= entry["t_start"])
        assert key not in done_before_run[run], f"run {run} requested {key}, finished before it started"
        if entry["status"] == 200:
            served.setdefault(key, entry["output_ids"])
    for r in rows:
        assert r["output_ids"] == served[(r["id"], r["sample_index"])]
