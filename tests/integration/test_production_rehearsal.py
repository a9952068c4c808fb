"""The production path rehearsed in one run: `snakemake --profile` on the tests' SLURM cluster, each
generate job launching the real SGLang 0.5.23 server on CPU, with a tokenizer in Kimi-K2.5's format
(TikToken remote code) beside the demo's weights (the same ids), both serving modes mixed in one
category, every turn of multi-turn conversations regenerated, the live loop stop and the quality
gate on, and the category in two shards, sampled greedily so that every row can be checked.

While it runs, `status` is asked for every shard's state and rows. One shard's SLURM job is
cancelled (scancel) once its journal holds some rows and before it has them all; Snakemake sees the
job fail, the run is submitted again through the profile and finishes. Then: every row is exact
(its prompt is the chat template's render of its history in its mode, its answer transformers'
greedy continuation on the same weights), every (id, sample, turn, mode) is in the dataset or the
rejected records exactly once, no server process outlived the cancel or the run, the cancelled
shard's journalled rows were reused (the rerun's server, by its own request log, was never sent
one), and the report is built.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from workdir import ROOT, SNAKEMAKE, Workdir, demo_rows, multi_turn_rows

import sglang_server
from eagle3_datagen.generation.journal import entry_key
from eagle3_datagen.generation.planning import shard_of
from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.storage.layout import journal_path
from eagle3_datagen.storage.tables import read_rows
from polling import wait_until
from real_sglang import ProcessWatch, alive, descendants, greedy_exact, processes_in, sglang_engine, sglang_servers
from slurm_cluster import PROFILE, holder_pid, squeue

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

CATEGORY = "chat"
SHARDS = 2
CUT = 0  # the shard whose job is cancelled: the one with the multi-turn conversations
# The cancel comes once the journal holds this many rows: in practice at 8 or a little more, as a
# server's first 8 answers are journalled together once checked against the tokenizer (identity.py).
CUT_AFTER_ROWS = 3
CONTEXT = 1024
KV_POOL_TOKENS = 2048  # small, but a full-context request fits (the client refuses a smaller pool)
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
STOP_IDS = (163585, 163586)  # [EOS] and <|im_end|>
# Each run through the cluster: two server start-ups at once on a loaded 2-core machine take minutes.
RUN_TIMEOUT_S = 1800

# What the run is configured with, in one place: the mode-mix key (config and sheet), the
# category's sheet row, and the config's keys laid over the complete config Workdir writes.
MIX = "mode_mix"
SHEET = {MIX: "thinking:0.5,instant:0.5", "shards": str(SHARDS)}
CONFIG = {
    MIX: "thinking",
    "turns": "all",
    "max_new_tokens": 48,
    "min_new_tokens": 8,
    "samples_per_prompt": 1,
    # One request at a time: the cancelled shard is still sending when its first rows are journalled.
    "client": {"concurrency": 1, "max_retries": 3, "progress_interval_s": 1, "request_timeout_floor_s": 3600},
    "quality": {
        "policies": {
            "repetition_loop": "quarantine",
            "unfinished_reasoning": "keep",
            "empty_answer": "quarantine",
            "unexpected_stop": "quarantine",
        },
        # A loop must cover 12 tokens; the live stop acts at twice that, within the 48-token budget.
        # (No demo prompt loops that early under greedy decoding: the run streams every answer with
        # the watch on, and the gate flags none; test_real_sglang_live_stop.py meets real loops.)
        "loop": {"min_tokens": 12, "min_repeats": 4, "max_period": 64},
        "live_stop": True,
        "stream_interval": 8,
    },
}
# The server logs every request it receives (its rid: row, turn, mode, run and attempt) as JSON:
# its own record of what it was sent.
REQUEST_LOG = ["--log-requests", "--log-requests-level", "0", "--log-requests-format", "json"]


# The installed command (make's venv step installs the package; `pip install .` does the same).
COMMAND = Path(sys.executable).with_name("eagle3-datagen")


def status(wd) -> list[dict]:
    """`eagle3-datagen status --json` of the run, as an operator asks it from the submitting host."""
    done = subprocess.run(
        [str(COMMAND), "status", "--directory", str(wd.path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def prompts() -> list[dict]:
    """The demo's multi-turn conversations (six fall in shard 0, one in shard 1) and the first four
    single-turn chats of each shard (tool calls among them)."""
    multi = multi_turn_rows()
    single = [r for r in demo_rows("chat", 47) if r not in multi]
    return (
        multi
        + [r for r in single if shard_of(r["id"], SHARDS) == 0][:4]
        + [r for r in single if shard_of(r["id"], SHARDS) == 1][:4]
    )


def rehearsal_workdir(path: Path, model_dir: Path, tokenizer_dir: Path) -> Workdir:
    wd = Workdir(
        path,
        tokenizer=tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={CATEGORY: prompts()},
        sheet={CATEGORY: SHEET},
    )
    with open(ROOT / "config" / "kimi-k2.5.yaml") as fh:
        wd.config["model"] = dict(yaml.safe_load(fh)["model"], tokenizer=str(tokenizer_dir), context_length=CONTEXT)
    wd.config.update(CONFIG)
    wd.set_sampling(GREEDY)
    extra = ["--tokenizer-path", str(tokenizer_dir), "--max-total-tokens", str(KV_POOL_TOKENS), *REQUEST_LOG]
    wd.config["engine"] = sglang_engine(model_dir, extra=extra)
    wd.config["engine"]["sglang"]["trust_remote_code"] = True
    wd.config["engine"]["job"] = {"cpus": 1, "mem_mb": 3000, "runtime": 60}
    wd.write_config()
    return wd


class StatusWatch:
    """`status` asked again and again from a thread while the runs go on (a shard of the tiny model
    sends its rows in seconds), every answer kept: each shard's state, rows done and planned."""

    def __init__(self, wd):
        self.wd, self.seen, self.errors, self._stop = wd, [], [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def ask(self) -> dict[int, dict]:
        (category,) = status(self.wd)
        assert category["category"] == CATEGORY and len(category["shards"]) == SHARDS, category
        return dict(enumerate(category["shards"]))

    def _poll(self):
        while not self._stop.is_set():
            try:
                self.seen.append(self.ask())
            except Exception as exc:  # kept, and failed on once the run is over
                self.errors.append(repr(exc))
            self._stop.wait(0.2)

    def latest(self) -> dict[int, dict] | None:
        return self.seen[-1] if self.seen else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def journal_lines(journal: Path) -> list[dict]:
    """Whole lines of a journal: every row its jobs finished."""
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]


def profile_run(wd, log: Path) -> subprocess.Popen:
    """`snakemake --profile` on the cluster; SIGINT at the limit (Snakemake then cancels its jobs)."""
    cmd = ["timeout", "-s", "INT", "-k", "30", str(RUN_TIMEOUT_S), *SNAKEMAKE, "--snakefile", str(wd.snakefile)]
    cmd += ["--directory", str(wd.path), "--profile", str(PROFILE)]
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=wd.env())


def cancel_mid_shard(wd, run: subprocess.Popen, statuses: StatusWatch, log: Path) -> dict:
    """Wait until status names shard CUT's SLURM job, then until its journal holds some rows (read
    without pause: the tiny model answers a row in a fraction of a second), scancel the job, and
    wait for its server processes to be gone and for Snakemake to give up on it."""
    journal = wd.path / journal_path("cache", CATEGORY, CUT, SHARDS)
    shards = wait_until(
        lambda: (shards := statuses.latest()) and shards[CUT]["slurm_job_id"] and shards,
        f"status names shard {CUT}'s SLURM job (log: {log})",
        timeout_s=RUN_TIMEOUT_S,
        process=run,
    )
    job = shards[CUT]["slurm_job_id"]
    wait_until(
        lambda: len(journal_lines(journal)) >= CUT_AFTER_ROWS and holder_pid(journal),
        f"shard {CUT} journals {CUT_AFTER_ROWS} rows (log: {log})",
        timeout_s=RUN_TIMEOUT_S,
        interval_s=0.01,
        process=run,
    )
    subprocess.run(["scancel", job], check=True)
    holder = holder_pid(journal)
    tree = descendants(holder)
    assert len(sglang_servers(tree)) == 1, tree
    wait_until(lambda: not alive(tree), "every server process of the cancelled job gone", timeout_s=300)
    run.wait(RUN_TIMEOUT_S)  # Snakemake sees the job fail, and exits once the other shard is done
    return {
        "job": job,
        "tree": tree,
        "returncode": run.returncode,
        "slurm_state": squeue([job])[job][0],
        "journal": journal_lines(journal),
        "status": statuses.ask()[CUT],  # as an operator finds the shard before resubmitting
    }


@pytest.fixture(scope="module")
def rehearsal(slurm_cluster, tmp_path_factory, demo_model_dir, kimi_tiktoken_dir):
    if not sglang_server.python().exists():
        pytest.skip(f"the real SGLang server is not installed ({sglang_server.python()}): tests/sglang_server.py")
    path = tmp_path_factory.mktemp("rehearsal")
    wd = rehearsal_workdir(path, demo_model_dir, kimi_tiktoken_dir)
    statuses = StatusWatch(wd)
    watch = ProcessWatch(lambda: processes_in(wd.path))
    start = time.monotonic()
    try:
        first = profile_run(wd, path.parent / "first.log")
        try:
            wd.cut = cancel_mid_shard(wd, first, statuses, path.parent / "first.log")
        finally:
            if first.poll() is None:
                first.send_signal(signal.SIGINT)  # Snakemake cancels its SLURM jobs
                first.wait(300)
        second = profile_run(wd, path.parent / "second.log")
        second.wait(RUN_TIMEOUT_S)
        assert second.returncode == 0, (path.parent / "second.log").read_text()[-8000:]
    finally:
        statuses.stop()
        wd.processes, wd.servers = watch.stop(), watch.servers()
        (path.parent / "statuses.json").write_text(json.dumps(statuses.seen))  # for a failure's reader
    wd.statuses, wd.final = statuses, statuses.ask()
    wd.elapsed = time.monotonic() - start
    print(f"production rehearsal: {wd.elapsed:.0f} s through SLURM, cancel and resubmission")
    return wd


def generations(wd) -> list[dict]:
    return read_rows(wd.path / "results" / "generations" / f"{CATEGORY}.parquet")


def test_status_showed_every_shard_in_flight_cancelled_and_done(rehearsal):
    wd = rehearsal
    assert not wd.statuses.errors, wd.statuses.errors[:3]
    # Rows journalled per shard (a turn skipped because its conversation ended is not: status counts none).
    rows = Counter(shard_of(r["id"], SHARDS) for r in generations(wd) if r["status"] != "skipped")
    for shard in range(SHARDS):
        seen = [s[shard] for s in wd.statuses.seen]
        assert {"waiting", "queued", "starting"} <= {s["state"] for s in seen}, [s["state"] for s in seen]
        # Its job's own word (the progress file): the SLURM job and node, while the server starts
        # and while it sends (the tiny model sends a small shard in seconds: either may be missed).
        in_flight = [s for s in seen if s["state"] in ("starting", "sending") and s["slurm_job_id"]]
        assert in_flight, (shard, [s["state"] for s in seen])
        assert all(s["host"] and 0 <= s["done"] <= s["planned"] for s in in_flight), in_flight
        final = wd.final[shard]
        assert (final["state"], final["done"], final["failed"]) == ("done", rows[shard], 0), final
    cut = wd.cut["status"]
    # The cancelled shard, before it is resubmitted: its job's end, and the rows its journal holds.
    assert cut["state"] in ("failed", "killed") and cut["slurm_job_id"] == wd.cut["job"], cut
    assert cut["done"] == len(wd.cut["journal"]) < cut["planned"], (cut, len(wd.cut["journal"]))
    # Resubmitted, it is seen in flight again, in a new job, its journalled rows counted as done.
    later = [s[CUT] for s in wd.statuses.seen if s[CUT]["state"] in ("starting", "sending")]
    later = [s for s in later if s["slurm_job_id"] not in (None, cut["slurm_job_id"])]
    assert later and all(s["done"] >= cut["done"] > 0 for s in later), later


def server_record(wd, shard: int) -> list[list[tuple]]:
    """Per attempt of a shard's job, in order, the rows its server received (by its own log)."""
    attempts = sorted((wd.path / "logs" / "generate" / CATEGORY / "attempts").glob(f"shard_{shard}.*.server.log"))
    received = []
    for log in attempts:
        lines = [line for line in log.read_text().splitlines() if "request.received" in line]
        # HEALTH_CHECK_*: the server's own probes of itself (/health), not the client's rows.
        requests = [
            r
            for r in (json.loads(line[line.index("{") :]) for line in lines)
            if not r["rid"].startswith("HEALTH_CHECK")
        ]
        assert all(r["obj"]["stream"] for r in requests), f"{log}: with live_stop, every request is streamed"
        received.append([parse_rid(r["rid"])[0] for r in requests])
    return received


def test_the_cancelled_shard_was_resumed_from_its_journal(rehearsal):
    wd = rehearsal
    assert wd.cut["returncode"] != 0 and wd.cut["slurm_state"] == "CANCELLED", wd.cut
    journalled = {entry_key(e): e for e in wd.cut["journal"] if e["status"] == "ok"}
    assert CUT_AFTER_ROWS <= len(journalled) < wd.cut["status"]["planned"], wd.cut  # cut mid-shard
    first, second = server_record(wd, CUT)
    assert second, "the resubmitted job sent nothing"
    assert set(journalled) <= set(first)
    resent = set(second) & set(journalled)
    assert not resent, f"journalled rows sent again by the resubmitted job: {sorted(resent)}"
    rows = {(r["id"], r["sample_index"], r["turn"], r["mode"]): r for r in generations(wd)}
    cut_rows = {k: r for k, r in rows.items() if shard_of(k[0], SHARDS) == CUT and r["status"] == "ok"}
    assert set(cut_rows) == set(journalled) | (set(second) & set(cut_rows)), "a row came from neither run"
    for key, entry in journalled.items():
        assert list(rows[key]["output_ids"]) == list(entry["output_ids"]), key
    (other,) = server_record(wd, 1 - CUT)  # the shard left alone ran once
    assert len(other) >= sum(1 for k in rows if shard_of(k[0], SHARDS) != CUT and rows[k]["status"] == "ok")


def test_every_prompt_is_the_templates_render_and_every_answer_greedy(rehearsal, kimi_tiktoken_dir, demo_model_dir):
    from transformers import AutoTokenizer

    wd = rehearsal
    tokenizer = AutoTokenizer.from_pretrained(str(kimi_tiktoken_dir), trust_remote_code=True)
    modes = wd.config["model"]["modes"]
    rows = generations(wd)
    ok = [r for r in rows if r["status"] == "ok"]
    by_key = {(r["id"], r["sample_index"], r["turn"], r["mode"]): r for r in rows}
    for r in ok:
        messages = json.loads(r["messages"])
        rendered = tokenizer.apply_chat_template(
            messages,
            tools=json.loads(r["tools"]) if r["tools"] else None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **modes[r["mode"]]["chat_template_kwargs"],
        )
        assert list(rendered) == list(r["prompt_ids"]), f"{r['id']} turn {r['turn']} ({r['mode']})"
        if r["turn"]:  # a later turn's history extends the turn before with the model's answer
            before = json.loads(by_key[(r["id"], r["sample_index"], r["turn"] - 1, r["mode"])]["messages"])
            assert messages[: len(before)] == before and messages[len(before)]["role"] == "assistant", r["id"]
    checked = greedy_exact(ok, demo_model_dir, stop_ids=STOP_IDS)
    print(f"rows: {Counter((r['status'], r['finish_type'], r['mode']) for r in rows)}; greedy-exact: {dict(checked)}")
    assert {r["mode"] for r in ok} == {"thinking", "instant"}
    assert any(key[0] for key in checked), f"no later turn was checked: {checked}"


def test_every_turn_is_in_the_dataset_or_rejected_once(rehearsal):
    wd = rehearsal
    planned = Counter()
    for p in read_rows(wd.path / "results" / "prompts" / f"{CATEGORY}.parquet"):
        assert p["status"] == "ok", p
        planned.update((p["id"], p["sample_index"], t, p["mode"]) for t in range(len(p["turn_ends"])))
    made = Counter((r["id"], r["sample_index"], r["turn"], r["mode"]) for r in generations(wd))
    assert made == planned
    ended = Counter()
    for row in wd.jsonl(f"results/dataset/{CATEGORY}.jsonl"):
        ended.update(
            (row["id"], row["sample_index"], t, row["mode"]) for t in range(row["turn"], row["turn"] + row["turns"])
        )
    for row in wd.jsonl(f"results/rejected/{CATEGORY}.jsonl"):
        assert row["reason"], row
        ended[(row["id"], row["sample_index"], row["turn"], row["mode"])] += 1
    assert ended == planned, {"twice": [k for k, n in ended.items() if n > 1], "lost": list(planned - ended)}


def test_no_server_process_outlived_the_cancel_or_the_run(rehearsal):
    wd = rehearsal
    assert len(wd.servers) == SHARDS + 1, wd.servers  # each shard's first job, and the resubmitted one
    assert set(wd.cut["tree"]) <= set(wd.processes)
    left = alive(wd.processes)
    assert not left, {pid: wd.processes[pid] for pid in left}
    assert not processes_in(wd.path)


def test_the_report_is_built(rehearsal):
    wd = rehearsal
    wd.snakemake("--report", "report.html", timeout=900)
    report = wd.path / "report.html"
    assert report.exists() and report.stat().st_size > 100_000, report.stat().st_size
