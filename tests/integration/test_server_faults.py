"""A server that fails to start, never becomes healthy, or dies mid-run fails its job clearly, within
the timeout, naming the server log, and leaves the journal to resume from.

Only the never-healthy server meets a short start-up timeout: the others have the generous one of a
loaded machine (the engine takes seconds to load its tokenizer), so that what they meet is their own
fault, not the timeout."""

import json
import time

import pytest
from workdir import Workdir

from eagle3_datagen.generation.requests import parse_rid

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 300  # a loaded machine's: the engine starts in seconds here


def prompts(n):
    return [
        {"id": f"s-{i:03d}", "messages": [{"role": "user", "content": f"Tell me about the number {i}."}]}
        for i in range(n)
    ]


@pytest.fixture
def workdir(tmp_path, qwen3_tokenizer_dir):
    def make(engine_args: str, n=8, startup_timeout_s=STARTUP_TIMEOUT_S):
        wd = Workdir(
            tmp_path,
            tokenizer=qwen3_tokenizer_dir,
            model_dir=None,
            backend="scripted",
            categories={"srv": prompts(n)},
            plain_qwen3=True,
            engine_args=engine_args,
        )
        wd.config["engine"]["startup_timeout_s"] = startup_timeout_s
        wd.config["client"].update(concurrency=2, max_retries=3, backoff_initial_s=0.2, backoff_max_s=0.5)
        wd.write_config()
        return wd

    return make


def failure_text(wd, proc):
    return proc.stdout + proc.stderr + (wd.path / "logs" / "generate" / "srv" / "shard_0.log").read_text()


def seconds_between(wd, first: str, then: str) -> float:
    """Seconds from the job log's line saying `first` to its line saying `then` (by their timestamps)."""
    from datetime import datetime

    lines = (wd.path / "logs" / "generate" / "srv" / "shard_0.log").read_text().splitlines()

    def at(text):
        line = next(line for line in lines if text in line)
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")

    return (at(then) - at(first)).total_seconds()


def test_a_server_that_exits_during_startup(workdir):
    wd = workdir("--fail-startup")
    started = time.monotonic()
    proc = wd.snakemake("--cores", "1", "results/generations/srv.parquet", check=False)
    assert proc.returncode != 0
    assert time.monotonic() - started < STARTUP_TIMEOUT_S  # seen exiting, not waited out
    text = failure_text(wd, proc)
    assert "exited with code 3 during start-up" in text
    assert "logs/generate/srv/shard_0.server.log" in text
    assert "failing start-up on purpose" in (wd.path / "logs" / "generate" / "srv" / "shard_0.server.log").read_text()


def test_a_server_that_never_becomes_healthy(workdir):
    wd = workdir("--never-healthy", startup_timeout_s=8)
    proc = wd.snakemake("--cores", "1", "results/generations/srv.parquet", check=False)
    assert proc.returncode != 0
    text = failure_text(wd, proc)
    assert "did not become healthy within 8 s" in text and "logs/generate/srv/shard_0.server.log" in text
    # The job gave up on the server 8 s after starting it (and its last health check), not later.
    waited = seconds_between(wd, "starting server", "did not become healthy")
    assert 8 <= waited < 8 + 60, waited


def test_a_server_that_dies_mid_run_leaves_a_journal_to_resume_from(workdir):
    wd = workdir("--die-after 6 --latency-ms 20:60", n=20)
    proc = wd.snakemake("--cores", "1", "results/generations/srv.parquet", check=False)
    assert proc.returncode != 0
    text = failure_text(wd, proc)
    assert "the server died during the run" in text and "logs/generate/srv/shard_0.server.log" in text
    journal = [
        json.loads(line)
        for line in (wd.path / "cache" / "journal" / "srv" / "shard_0-of-1.jsonl").read_text().splitlines()
    ]
    done = {e["id"] for e in journal if e["status"] == "ok"}
    assert 1 <= len(done) <= 6
    served_before = len(wd.engine_record("srv"))

    wd.engine_args = ""
    wd.snakemake("--cores", "1", "results/generations/srv.parquet")
    resent = [parse_rid(e["rid"])[0][0] for e in wd.engine_record("srv")[served_before:]]
    assert not set(resent) & done
    assert len(resent) == 20 - len(done)
