"""Exactly once per (id, sample_index): kills, failures and reruns, through the real workflow."""

import os
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir

pytestmark = pytest.mark.slow


def prompts(n, prefix="p"):
    return [{"id": f"{prefix}-{i:03d}", "messages": [{"role": "user", "content": f"Question {i}: what is {i} times {i + 1}?"}]} for i in range(n)]


def by_run(record):
    """Engine record entries grouped by the client's run nonce ({id}.{sample}.{nonce}.{attempt})."""
    runs = defaultdict(list)
    for entry in record:
        row_id, sample, nonce, _attempt = entry["rid"].rsplit(".", 3)
        runs[nonce].append(((row_id, int(sample)), entry))
    return runs


def journal_keys(wd, category, status="ok"):
    import json

    path = wd.path / "cache" / "journal" / category / "shard_0-of-1.jsonl"
    keys = set()
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn tail
        if entry["status"] == status:
            keys.add((entry["id"], entry["sample_index"]))
    return keys


@pytest.fixture
def scripted(tmp_path, qwen3_tokenizer_dir):
    def make(categories, local=None, **overrides):
        wd = Workdir(tmp_path, tokenizer=qwen3_tokenizer_dir, model_dir=None, backend="scripted", categories=categories, **overrides, plain_qwen3=True)
        wd.config["engine"]["local"].update(local or {})
        wd.write_config()
        return wd

    return make


def test_sigkill_mid_run_then_rerun_gives_every_row_exactly_once(scripted):
    n = 80
    wd = scripted({"kill": prompts(n)}, local={"latency_ms": "100:300"}, client={"concurrency": 4, "max_retries": 3, "progress_interval_s": 1})
    target = "results/generations/kill.parquet"
    cmd = SNAKEMAKE + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(wd.path), "--cores", "1", target]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    journal = wd.path / "cache" / "journal" / "kill" / "shard_0-of-1.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if journal.exists() and len(journal.read_bytes().splitlines()) >= 15:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the generate job never journalled 15 rows")
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake, the job and (by its parent watch) the engine
    proc.wait()
    done_before = journal_keys(wd, "kill")
    assert 15 <= len(done_before) < n

    wd.snakemake("--unlock")
    wd.snakemake("--cores", "1", "--rerun-incomplete", target)
    from eagle3_datagen.tables import read_rows

    rows = read_rows(wd.path / target)
    keys = [(r["id"], r["sample_index"]) for r in rows]
    assert len(keys) == n and len(set(keys)) == n
    assert all(r["status"] == "ok" for r in rows)

    runs = by_run(wd.engine_record("kill"))
    assert len(runs) == 2
    first, second = sorted(runs.values(), key=lambda entries: min(e["t_start"] for _, e in entries))
    resent = {key for key, _ in second} & done_before
    assert not resent, f"completed rows requested again: {sorted(resent)[:5]}"
    # Every row the rerun sent is one the first run had not finished.
    assert {key for key, _ in second} == {(f"p-{i:03d}", 0) for i in range(n)} - done_before
    # The data of a row finished before the kill is what the engine served then.
    served_first = {key: e["output_ids"] for key, e in first if e.get("status") == 200}
    for r in rows:
        if (r["id"], 0) in done_before:
            assert r["output_ids"] == served_first[(r["id"], 0)]


def test_failed_rows_are_recorded_and_a_rerun_sends_only_them(scripted):
    wd = scripted({"flaky": prompts(12, "f")}, local={"fail_rids": r"^f-00[37]\."}, client={"concurrency": 4, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}, max_failed_share=0.0)
    # Two failures in twelve rows is more than a share of 0: the job fails, keeping its journal.
    proc = wd.snakemake("--cores", "1", check=False)
    assert proc.returncode != 0
    log = (wd.path / "logs" / "generate" / "flaky" / "shard_0.log").read_text()
    assert "2 of 12 rows failed" in log and "max_failed_share" in log
    assert journal_keys(wd, "flaky", "failed") == {("f-003", 0), ("f-007", 0)}
    assert not (wd.path / "results" / "generations" / "flaky.parquet").exists()

    # Tolerating the share, the run completes and the failures are accounted with their reason.
    wd.config["max_failed_share"] = 0.25
    wd.write_config()
    wd.snakemake("--cores", "1")
    rejected = {r["id"]: r for r in wd.jsonl("results/dataset/flaky.rejected.jsonl")}
    assert set(rejected) == {"f-003", "f-007"}
    assert all(r["status"] == "failed" and "HTTP 500" in r["reason"] for r in rejected.values())
    assert len(wd.jsonl("results/dataset/flaky.jsonl")) == 10

    # With the fault gone, a rerun sends exactly the two failed rows.
    wd.config["engine"]["local"]["fail_rids"] = None
    wd.write_config()
    wd.snakemake("--cores", "1")
    runs = by_run(wd.engine_record("flaky"))
    last = max(runs.values(), key=lambda entries: min(e["t_start"] for _, e in entries))
    assert {key for key, _ in last} == {("f-003", 0), ("f-007", 0)}
    assert len(wd.jsonl("results/dataset/flaky.jsonl")) == 12
    assert wd.jsonl("results/dataset/flaky.rejected.jsonl") == []


def test_two_samples_per_prompt_are_independent_requests_with_their_own_seeds(scripted):
    wd = scripted({"multi": prompts(5, "m")}, samples_per_prompt=2)
    wd.snakemake("--cores", "1")
    rows = wd.jsonl("results/dataset/multi.jsonl")
    assert sorted((r["id"], r["sample_index"]) for r in rows) == sorted((f"m-{i:03d}", s) for i in range(5) for s in (0, 1))
    seeds = {}
    for r in rows:
        seeds.setdefault(r["id"], set()).add(r["seed"])
    assert all(len(s) == 2 for s in seeds.values())
    record = wd.engine_record("multi")
    assert len(record) == 10
    assert all(e["sampling_params"].get("n", 1) == 1 for e in record)
    assert {e["sampling_params"]["sampling_seed"] for e in record} == {r["seed"] for r in rows}
