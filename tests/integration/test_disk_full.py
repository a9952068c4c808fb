"""A full disk loses nothing: on a tmpfs with a size limit (root only), the generate job stops with
a `DiskFull` naming its journal, the journal holds only whole lines, and a rerun once the disk has
room gives every row exactly once without sending a journalled request again. The table, JSON lines
and lock writers stop the same way, and leave no file behind."""

import errno
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.locks import ShardLock
from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.steps.export_dataset import JsonlWriter, merge_dataset
from eagle3_datagen.storage.disk import DiskFull
from eagle3_datagen.storage.layout import journal_path
from eagle3_datagen.storage.tables import IDS, Batching, TableWriter, read_rows
from engine_thread import running_engine
from generate_step import external, generate_shard

pytestmark = pytest.mark.slow

CONCURRENCY = 4
CLIENT = {"concurrency": CONCURRENCY, "max_retries": 0, "progress_interval_s": 0.5}
BUDGET = {"max_new_tokens": 1024, "min_new_tokens": 4, "reserve_tokens": 2}
# Answers of 600-900 tokens: journal entries of about 4-6 kB, so that 40 rows need about 200 kB.
ANSWER_TOKENS = (600, 900)


def _run(*args):
    return subprocess.run(args, capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    """`mount(name, size_k)`: a tmpfs of `size_k` kB at tmp_path/name; `resize(where, size_k)`
    changes its size. Unmounted at the end. Skipped without root or where tmpfs cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(name, size_k):
        where = tmp_path / name
        where.mkdir()
        done = _run("mount", "-t", "tmpfs", "-o", f"size={size_k}k", "tmpfs", str(where))
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    def resize(where, size_k):
        done = _run("mount", "-o", f"remount,size={size_k}k", str(where))
        assert done.returncode == 0, done.stderr

    yield mount, resize
    for where in reversed(mounted):
        if _run("umount", str(where)).returncode:
            _run("umount", "-l", str(where))


def fill(where):
    """Write a file into `where` until its disk is full."""
    chunk = os.urandom(4096)
    with open(where / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def whole_lines(path):
    """The journal's entries, checking that every line is whole JSON ending in a newline."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the journal ends in part of a line"
    return [json.loads(line) for line in data.splitlines()]


def sent(record):
    """(id, sample_index) of each request the engine served, in order."""
    lines = record.read_text().splitlines() if record.exists() else []
    return [parse_rid(json.loads(line)["rid"])[0][:2] for line in lines]


def run_generate(prompts, model, url, tmp_path, cache_dir):
    return generate_shard(prompts, model, external(url), tmp_path, client=CLIENT, budget=BUDGET, cache_dir=cache_dir)


def test_a_full_journal_disk_stops_the_job_and_the_rerun_sends_only_what_was_lost(
    small_disk, make_prompts, qwen3_tokenizer_dir, tmp_path
):
    mount, resize = small_disk
    n = 40
    prompts, model = make_prompts(conversations(n), max_new_tokens=BUDGET["max_new_tokens"])
    cache = mount("cache", 96)  # room for a third of the journal or so
    journal = journal_path(cache, "cat", 0, 1)
    record = tmp_path / "record.jsonl"
    backend = ScriptedBackend(str(qwen3_tokenizer_dir), answer_tokens=ANSWER_TOKENS)
    with running_engine(backend, context_length=8192, record=record) as url:
        with pytest.raises(DiskFull) as failure:
            run_generate(prompts, model, url, tmp_path, cache)
        out = tmp_path / "results" / "generations" / "cat" / "shard_0.parquet"
        assert str(journal) in str(failure.value) and "did not fit" in str(failure.value)
        assert not out.exists() and not out.with_name(out.name + ".tmp").exists()
        journalled = {(e["id"], e["sample_index"]) for e in whole_lines(journal)}
        first = sent(record)
        assert 0 < len(journalled) < n and journalled <= set(first)
        # Lost: the entry that did not fit, the requests in flight (at most CONCURRENCY) and those the
        # server had answered whose lines were not yet written (an answered request gives its slot back
        # before its answer is read and journalled, so under load a few more: at most one per slot).
        # The job stopped there: it did not send the rest of the shard.
        lost = len(first) - len(journalled)
        assert len(set(first)) == len(first) and 1 <= lost <= 2 * CONCURRENCY < n - len(journalled)

        resize(cache, 4096)
        run_generate(prompts, model, url, tmp_path, cache)
    rows = read_rows(out)
    keys = [(r["id"], r["sample_index"]) for r in rows]
    assert sorted(keys) == sorted((c["id"], 0) for c in conversations(n)) and len(set(keys)) == n
    assert all(r["status"] == "ok" for r in rows)
    again = sent(record)[len(first) :]
    assert not set(again) & journalled  # no journalled request is sent again
    assert sorted(again) == sorted(set(keys) - journalled)  # and every other one once
    assert len(first) + len(again) == n + lost
    assert len(whole_lines(journal)) == n


@pytest.mark.parametrize("fails_at", ["write", "close"])
def test_a_table_on_a_full_disk_leaves_no_file(small_disk, fails_at):
    mount, _ = small_disk
    disk = mount("tables", 64)
    schema = pa.schema([("id", pa.string()), ("ids", IDS)])
    rng = np.random.default_rng(0)
    rows = ({"id": f"r{i}", "ids": rng.integers(0, 1 << 30, 4000).tolist()} for i in range(1000))
    # "write": batches are written as rows come; "close": all of them wait in memory for `close`.
    batching = Batching(rows=4, tokens=16_000) if fails_at == "write" else Batching(rows=10_000, tokens=10**9)
    path = disk / "t.parquet"
    writer = TableWriter(path, schema, batching)
    with pytest.raises(DiskFull, match=f"table {path}: the disk is full"):  # no `with`: the writer cleans up itself
        for row in rows:
            writer.write([row])
            if fails_at == "close" and writer.rows == 40:
                writer.close()
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("writer", ["jsonl", "merge"])
def test_json_lines_on_a_full_disk_leave_no_file(small_disk, tmp_path, writer):
    mount, _ = small_disk
    disk = mount("lines", 64)
    rows = [{"input_ids": list(range(i, i + 3000)), "loss_mask": [1] * 3000} for i in range(100)]
    out = disk / "out.jsonl"
    with pytest.raises(DiskFull, match=f"JSON lines file {out}: the disk is full"):
        if writer == "jsonl":
            with JsonlWriter(out) as dst:
                dst.write(rows)
        else:
            source = tmp_path / "source.jsonl"
            source.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
            merge_dataset(dataset=[source], train=out)
    assert list(disk.iterdir()) == []


def test_a_lock_on_a_full_disk_is_refused_plainly_and_not_held(small_disk):
    mount, _ = small_disk
    disk = mount("locks", 16)
    journal = disk / "journal" / "shard_0-of-1.jsonl"
    journal.parent.mkdir()
    fill(disk)
    with pytest.raises(DiskFull, match=f"lock file of the journal {journal}.lock: the disk is full"):
        ShardLock(journal).acquire()
    # Not held: another process takes it at once (a process never conflicts with its own lockf locks).
    take = "import fcntl, os, sys; fcntl.lockf(os.open(sys.argv[1], os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    assert subprocess.run([sys.executable, "-c", take, f"{journal}.lock"]).returncode == 0
    (disk / "filler").unlink()
    with ShardLock(journal) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
