"""`status` in-process: the progress file a generate job publishes, the journal's lines since, the
lock's word (held by another process, or left by a dead one), and a run's shards and steps as the
command shows them. (A generate job in flight, killed and finished: tests/integration/test_status_in_flight.py.)"""

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.locks import ShardLock
from eagle3_datagen.generation.progress import ShardProgress, lock_held, progress_path, recent_rate, tail, view
from eagle3_datagen.steps import status
from eagle3_datagen.storage.layout import journal_path
from eagle3_datagen.storage.tables import read_provenance, read_rows
from engine_thread import running_engine
from generate_step import external, generate_shard
from polling import wait_until

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
PLAN = {"to_send": 8, "reused": 2, "reused_output_tokens": 30, "skipped": 1, "later_turns": 2}


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def entry(i, status="ok", tokens=5):
    return {
        "id": f"r{i}",
        "sample_index": 0,
        "status": status,
        "output_ids": list(range(tokens)),
        "fingerprint": f"f{i}",
    }


def append(journal, entries):
    with open(journal, "ab") as fh:
        for e in entries:
            fh.write((json.dumps(e) + "\n").encode())


@pytest.fixture
def held_lock(tmp_path):
    """Hold a journal's lock from another process, as a generate job on another node would."""
    procs = []

    def hold(journal):
        code = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {SCRIPTS!r})
            from eagle3_datagen.generation.locks import ShardLock
            ShardLock({str(journal)!r}).acquire()
            print("held", flush=True)
            time.sleep(600)
            """
        )
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def test_progress_file_and_journal_tail_count_every_journalled_row(tmp_path, held_lock):
    journal = tmp_path / "j.jsonl"
    append(journal, [entry(0), entry(1)])  # rows of an earlier attempt (the plan's reused)
    clock = Clock()
    progress = ShardProgress(journal, category="c", shard=0, shards=1, plan=PLAN, interval_s=10, clock=clock)
    facts = json.loads(progress_path(journal).read_text())
    assert facts["state"] == "starting" and facts["planned"] == 12 and facts["journal_bytes"] == journal.stat().st_size

    append(journal, [entry(i) for i in range(2, 6)])
    clock.t += 20
    progress.update({"done": 4, "failed": 0, "retries": 3, "output_tokens": 20, "in_flight": 4, "limit": 8})
    # Rows journalled after the last publish, one of them failed, and a torn line being written.
    append(journal, [entry(6), entry(7, status="failed", tokens=0)])
    with open(journal, "ab") as fh:
        fh.write(b'{"id": "r8", "sample')

    proc = held_lock(journal)
    facts = json.loads(progress_path(journal).read_text())
    shard = view(journal, facts, now=clock.t + 5)
    assert shard.state == "sending"
    assert shard.done == 2 + 4 + 2  # reused + published + whole lines since
    assert shard.failed == 1 and shard.retries == 3 and shard.limit == 8 and shard.in_flight == 4
    assert shard.output_tokens == 30 + 20 + 5
    assert shard.eta_s is not None and shard.requests_per_s > 0
    assert shard.host and shard.facts["pid"] == os.getpid()

    proc.kill()
    proc.wait()
    assert not lock_held(journal)
    shard = view(journal, facts, now=clock.t + 5)
    assert shard.state == "killed" and shard.done == 8 and shard.eta_s is None


def test_a_lock_is_tested_without_taking_it(tmp_path, held_lock):
    journal = tmp_path / "j.jsonl"
    assert not lock_held(journal)  # no lock file at all
    with ShardLock(journal):
        pass
    assert not lock_held(journal)  # a lock file, no holder
    proc = held_lock(journal)
    for _ in range(3):
        assert lock_held(journal)
    proc.kill()
    proc.wait()
    # status never took the lock: the next job gets it at once.
    with ShardLock(journal):
        assert ShardLock(journal).path.exists()


def test_the_job_end_is_published_with_its_error(tmp_path):
    journal = tmp_path / "j.jsonl"
    progress = ShardProgress(journal, category="c", shard=0, shards=1, plan=PLAN, clock=Clock())
    progress.finish(RuntimeError("c: 3 of 8 rows failed\ndetails"))
    facts = json.loads(progress_path(journal).read_text())
    assert facts["state"] == "failed" and facts["error"] == "c: 3 of 8 rows failed"
    assert view(journal, facts).state == "failed"
    assert not list(tmp_path.glob("*.tmp"))


def test_recent_rate_spans_the_last_minutes_up_to_now():
    samples = [[0, 0, 0], [100, 100, 1000], [400, 160, 1600], [600, 200, 2000]]
    rows, tokens = recent_rate(samples, now=600, window_s=300)
    assert rows == pytest.approx((200 - 160) / (600 - 400))
    assert tokens == pytest.approx((2000 - 1600) / 200)
    # No row finished for a while: the rate falls with the time since.
    assert recent_rate(samples, now=900, window_s=300)[0] < rows


def test_tail_counts_whole_lines_from_an_offset(tmp_path):
    journal = tmp_path / "j.jsonl"
    append(journal, [entry(0), entry(1)])
    offset = journal.stat().st_size
    append(journal, [entry(2, tokens=7), entry(3, status="failed", tokens=0)])
    with open(journal, "ab") as fh:
        fh.write(b"{torn")
    found = tail(journal, offset)
    assert (found.done, found.failed, found.output_tokens) == (2, 1, 7)
    assert found.end == journal.stat().st_size - len(b"{torn")
    assert tail(tmp_path / "missing.jsonl", 0).done == 0


def write_run(root, categories):
    """A run directory: config, sheet, and whatever files the test adds."""
    (root / "config").mkdir(parents=True)
    sheet = ["category\tprompts\tshards"] + [f"{c}\tconfig/prompts/{c}.jsonl\t{n}" for c, n in categories.items()]
    (root / "config" / "categories.tsv").write_text("\n".join(sheet) + "\n")
    (root / "config" / "config.yaml").write_text(yaml.safe_dump({"categories": "config/categories.tsv"}))


def touch(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_run_shows_each_shard_and_what_waits(tmp_path, held_lock):
    root = tmp_path / "run"
    write_run(root, {"alpha": 2, "beta": 1, "gamma": 1})
    touch(root / "results/prompts/alpha.parquet")
    touch(root / "results/prompts/beta.parquet")
    for shard in (0, 1):
        touch(root / f"results/plan/alpha/shard_{shard}.json", json.dumps(PLAN))
    # alpha 0: a job sending on another host (its lock held); alpha 1: submitted to SLURM, not started.
    journal = root / journal_path("cache", "alpha", 0, 2)
    journal.parent.mkdir(parents=True)
    ShardProgress(journal, category="alpha", shard=0, shards=2, plan=PLAN).update({"done": 3}, force=True)
    held_lock(journal)
    marker = base64.urlsafe_b64encode(b"results/generations/alpha/shard_1.parquet").decode()
    touch(root / ".snakemake/incomplete" / marker, json.dumps({"external_jobid": "4242"}))
    # beta: planned, no job yet; gamma: waiting on its prompts.
    touch(root / "results/plan/beta/shard_0.json", json.dumps(PLAN))

    views = {v.name: v for v in status.run_status(root, status.read_config([root / "config/config.yaml"]))}
    a0, a1 = views["alpha"].shards
    assert (a0.state, a0.done, a0.planned) == ("sending", 5, 12)
    assert (a1.state, a1.slurm_job_id) == ("queued", "4242")
    assert (views["beta"].shards[0].state, views["beta"].shards[0].done) == ("queued", 2)
    assert (views["gamma"].shards[0].state, views["gamma"].shards[0].error) == ("waiting", "on tokenize_prompts")
    assert dict(views["alpha"].steps)["merge_shards"] == "waits on generate (0 of 2 shards done)"

    text = status.render(list(views.values()), root, now=0)
    assert "submitted as SLURM job 4242" in text and "on tokenize_prompts" in text
    lines = {line.split()[0] + line.split()[1]: line for line in text.splitlines() if line.startswith("alpha")}
    assert " 5 " in lines["alpha0/2"] and "sending" in lines["alpha0/2"]
    total = next(line for line in text.splitlines() if line.startswith("total"))
    assert total.split()[1:3] == ["9", "36"]  # 5 + 2 + 2 done of 3 × 12 planned


def generate_once(prompts, model, tmp_path):
    with running_engine(ScriptedBackend(str(model["tokenizer"]))) as url:
        out = generate_shard(
            prompts,
            model,
            external(url),
            tmp_path,
            client={"concurrency": 4, "progress_interval_s": 0.2},
            budget={"max_new_tokens": 32, "min_new_tokens": 4, "reserve_tokens": 2},
            out=tmp_path / "gens.parquet",
        )
    return read_rows(out)


def test_a_generate_job_publishes_its_progress_and_status_reads_the_finished_shard(make_prompts, tmp_path):
    prompts, model = make_prompts(conversations(10) + [{"id": "bad", "messages": "x"}])
    rows = generate_once(prompts, model, tmp_path)
    # The job's whole time with its server (what it holds GPUs for) is recorded beside its sending time.
    job = read_provenance(tmp_path / "gens.parquet")
    assert job["job"]["wall_s"] >= job["client"]["elapsed_s"] > 0
    journal = journal_path(tmp_path / "cache", "cat", 0, 1)
    facts = json.loads(progress_path(journal).read_text())
    ok = [r for r in rows if r["status"] == "ok"]
    tokens = sum(len(r["output_ids"]) for r in ok)
    assert facts["state"] == "done" and facts["sent"]["done"] == len(ok) == 10 and facts["skipped"] == 1
    assert facts["sent"]["output_tokens"] == tokens and facts["sent"]["limit"] == 4
    assert facts["journal_bytes"] == journal.stat().st_size
    shard = view(journal, facts)
    assert (shard.state, shard.done, shard.planned, shard.failed, shard.output_tokens) == ("done", 10, 10, 0, tokens)
    # Again: nothing is sent, every row is reused, and the progress file says so.
    generate_once(prompts, model, tmp_path)
    facts = json.loads(progress_path(journal).read_text())
    assert (facts["state"], facts["reused"], facts["sent"]["done"]) == ("done", 10, 0)
    assert view(journal, facts).output_tokens == tokens


def test_the_command_prints_json_and_watches_until_interrupted(tmp_path, monkeypatch, capsys):
    root = tmp_path / "run"
    write_run(root, {"alpha": 1})
    touch(root / "results/prompts/alpha.parquet")
    touch(root / "results/plan/alpha/shard_0.json", json.dumps(PLAN))
    assert status.main(["--directory", str(root), "--json"]) == 0
    (alpha,) = json.loads(capsys.readouterr().out)
    assert alpha["shards"][0]["state"] == "queued" and alpha["shards"][0]["planned"] == 12

    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", sleep)
    assert status.main(["--directory", str(root), "--watch", "3"]) == 0
    out = capsys.readouterr().out
    assert sleeps == [3.0, 3.0] and out.count("\x1b[H\x1b[2J") == 2 and out.count("alpha") >= 4


def test_a_job_stopped_by_a_signal_says_so(tmp_path):
    journal = tmp_path / "j.jsonl"
    progress = ShardProgress(journal, category="c", shard=0, shards=1, plan=PLAN, clock=Clock())
    progress.finish(SystemExit(143))
    shard = view(journal, json.loads(progress_path(journal).read_text()))
    assert shard.state == "failed" and "stopped by a signal" in shard.error and "143" in shard.error


def test_the_header_tells_a_running_snakemake_from_a_lock_left_by_a_killed_one(tmp_path):
    root = tmp_path / "run"
    write_run(root, {"alpha": 1})
    assert status.Markers(root).says() == "no Snakemake runs here"
    touch(root / ".snakemake/locks/0.input.lock")
    # A process named snakemake working in the run's directory, as `snakemake --directory` is.
    proc = subprocess.Popen(["bash", "-c", "exec -a snakemake sleep 600"], cwd=root)
    try:
        wait_until(lambda: status.Markers(root).snakemake_pids, "the process is named snakemake", timeout_s=60)
        assert status.Markers(root).snakemake_pids == [proc.pid]
        assert status.Markers(root).says() == f"Snakemake runs here (pid {proc.pid})"
    finally:
        proc.kill()
        proc.wait()
    assert status.Markers(root).says().startswith("Snakemake's lock is left by a run that is gone")
