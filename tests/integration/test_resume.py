"""Exactly once per (id, sample_index) when Snakemake itself is killed: the real workflow, unlocked
and rerun. (Failed rows, samples and resuming a journal are proven in-process: tests/unit/test_generate.py.)"""

import os
import signal
import subprocess
import time
from collections import defaultdict

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir

pytestmark = pytest.mark.slow


def prompts(n, prefix="p"):
    return [
        {
            "id": f"{prefix}-{i:03d}",
            "messages": [{"role": "user", "content": f"Question {i}: what is {i} times {i + 1}?"}],
        }
        for i in range(n)
    ]


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
    def make(categories, engine_args="", **overrides):
        return Workdir(
            tmp_path,
            tokenizer=qwen3_tokenizer_dir,
            model_dir=None,
            backend="scripted",
            categories=categories,
            engine_args=engine_args,
            **overrides,
            plain_qwen3=True,
        )

    return make


def test_sigkill_mid_run_then_rerun_gives_every_row_exactly_once(scripted):
    n = 80
    wd = scripted(
        {"kill": prompts(n)},
        engine_args="--latency-ms 100:300",
        client={"concurrency": 4, "max_retries": 3, "progress_interval_s": 1},
    )
    target = "results/generations/kill.parquet"
    cmd = SNAKEMAKE + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(wd.path), "--cores", "1", target]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=wd.env()
    )
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
