"""Exactly once per (id, sample_index) when Snakemake itself is killed: the real workflow, unlocked
and rerun. (Failed rows, samples and resuming a journal are proven in-process: tests/unit/test_generate.py.)"""

import os
import signal
import subprocess
from collections import defaultdict

import pytest
from workdir import ROOT, SNAKEMAKE, Workdir

from eagle3_datagen.generation.requests import parse_rid
from polling import wait_until

pytestmark = pytest.mark.slow

# How long a run may take to reach the point it is killed at: seconds here; generous for a loaded
# machine, and a run that fails first ends the wait at once.
REACH_S = 600


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
        (row_id, sample, _turn, _mode), nonce, _attempt = parse_rid(entry["rid"])
        runs[nonce].append(((row_id, sample), entry))
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
    try:
        wait_until(
            lambda: journal.exists() and len(journal.read_bytes().splitlines()) >= 15,
            "the generate job journals 15 rows",
            timeout_s=REACH_S,
            process=proc,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake, the job and (by its parent watch) the engine
        proc.wait()
    done_before = journal_keys(wd, "kill")
    assert 15 <= len(done_before) < n

    wd.snakemake("--unlock")
    wd.snakemake("--cores", "1", "--rerun-incomplete", target)
    from eagle3_datagen.storage.tables import read_rows

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


def conversations(n, turns=4, prefix="m"):
    """Conversations of `turns` user turns, the original answers in between (replaced by the model's)."""
    rows = []
    for i in range(n):
        messages = []
        for k in range(turns):
            if k:
                messages.append({"role": "assistant", "content": f"An original answer {k}."})
            messages.append({"role": "user", "content": f"Conversation {i}, question {k}: what is {i} + {k}?"})
        rows.append({"id": f"{prefix}-{i:03d}", "messages": messages})
    return rows


def ok_turns(journal):
    import json

    done = set()
    for line in journal.read_text().splitlines() if journal.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn tail
        if entry["status"] == "ok":
            done.add((entry["id"], entry["sample_index"], entry.get("turn", 0), entry.get("mode", "default")))
    return done


def test_sigkill_at_random_points_of_a_multi_turn_run_gives_every_turn_exactly_once(scripted):
    import random

    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    n, turns = 24, 4
    wd = scripted(
        {"talk": conversations(n, turns)},
        engine_args="--latency-ms 50:200",
        client={"concurrency": 4, "max_retries": 3, "progress_interval_s": 1},
        max_new_tokens=400,
        turns="all",
    )
    target = "results/generations/talk.parquet"
    cmd = SNAKEMAKE + ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(wd.path), "--cores", "1", target]
    journal = wd.path / "cache" / "journal" / "talk" / "shard_0-of-1.jsonl"
    done_before_run = []  # the ok turns journalled when each run started
    for kill in range(2):
        done_before_run.append(ok_turns(journal))
        at = len(done_before_run[-1]) + rng.randint(5, 25)  # a random point of this run
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=wd.env()
        )
        try:
            wait_until(
                lambda at=at: len(ok_turns(journal)) >= at,
                f"seed {seed}: run {kill} journals {at} turns",
                timeout_s=REACH_S,
                process=proc,
            )
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # snakemake, the job and (by its parent watch) the engine
            proc.wait()
        wd.snakemake("--unlock")
    done_before_run.append(ok_turns(journal))
    wd.snakemake("--cores", "1", "--rerun-incomplete", target)
    from eagle3_datagen.storage.tables import read_rows

    rows = read_rows(wd.path / target)
    keys = [(r["id"], r["sample_index"], r["turn"], r["mode"]) for r in rows]
    assert len(keys) == n * turns and len(set(keys)) == n * turns, f"seed {seed}"
    produced = {k for k, r in zip(keys, rows) if r["status"] == "ok"}
    assert len(produced) > n, f"seed {seed}: later turns were made"  # more than the first turns
    ended = [r for r in rows if r["status"] != "ok"]
    assert all(r["status"] == "skipped" and r["error"].startswith("conversation ended") for r in ended)

    # No completed turn is requested again: each run sends only turns no earlier run finished.
    runs: dict[str, list] = defaultdict(list)
    first_seen: dict[str, float] = {}
    for entry in wd.engine_record("talk"):
        key, nonce, _attempt = parse_rid(entry["rid"])
        runs[nonce].append((key, entry))
        first_seen[nonce] = min(first_seen.get(nonce, entry["t_start"]), entry["t_start"])
    order = sorted(runs, key=first_seen.get)
    assert len(order) == 3, f"seed {seed}: {len(order)} runs"
    for before, nonce in zip(done_before_run, order):
        resent = {key for key, _ in runs[nonce]} & before
        assert not resent, f"seed {seed}: completed turns requested again: {sorted(resent)[:5]}"
    # Each row holds what the engine served for its turn (the answer journalled first, if it was
    # sent twice because a kill came between the answer and its journal line).
    served = defaultdict(list)
    for nonce in order:
        for key, entry in runs[nonce]:
            if entry.get("status") == 200:
                served[key].append((entry["input_ids"], entry["output_ids"]))
    for key, r in zip(keys, rows):
        if r["status"] == "ok":
            assert (r["prompt_ids"], r["output_ids"]) in served[key], f"seed {seed}: {key}"
