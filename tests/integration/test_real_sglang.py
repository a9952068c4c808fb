"""The production engine path against the real SGLang 0.5.23 server on CPU (engine.kind: sglang).

The whole workflow launches the real server from its own interpreter (tests/sglang_server.py)
with the CPU settings passed as a cluster user passes theirs, through `engine.sglang.env` and
`engine.sglang.extra_args`. Its rows are checked against an independent oracle: with greedy
sampling, every generated turn's output ids are transformers' greedy continuation of its prompt
ids on the same weights. The KV pool is kept small (`--max-total-tokens`) so `concurrency: auto`
meets real retractions. A job killed by SIGKILL or stopped by SIGTERM leaves none of the server's
processes (HTTP server, scheduler, detokenizer) behind.
"""

import subprocess
import sys
import textwrap
from collections import Counter

import pytest
from workdir import ROOT, Workdir, demo_rows

from eagle3_datagen.storage.tables import read_rows
from polling import wait_until
from real_sglang import (
    STARTUP_TIMEOUT_S,
    ProcessWatch,
    alive,
    descendants,
    greedy_exact,
    real_server,
    sglang_engine,
    sglang_servers,
)

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

CONTEXT = 512
# Just above the context (one full-context request must fit), and small enough that the requests it
# admits outgrow it: SGLang admits a request when its prompt fits beside the running ones' expected
# growth (SGLANG_INIT_NEW_TOKEN_RATIO below, near zero), so seven or eight ~50-token prompts run at
# once, and their 23-40-token answers need more than is left. (At 1024 tokens the pool held about
# nine such answers at once: a run on a loaded machine, whose requests arrive more spread out, then
# met no retraction at all.)
KV_POOL_TOKENS = 560
MAX_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory, demo_model_dir):
    """The demo categories (tool calls and multi-turn chats included) generated greedily by real
    SGLang servers that the generate jobs launch, with every process they started recorded."""
    path = tmp_path_factory.mktemp("real_sglang")
    wd = Workdir(
        path,
        tokenizer=demo_model_dir,
        model_dir=demo_model_dir,
        backend="model",
        categories={"math": demo_rows("math", 47), "chat": demo_rows("chat", 47)},
    )
    wd.config["engine"] = sglang_engine(demo_model_dir, extra=["--max-total-tokens", str(KV_POOL_TOKENS)])
    # SGLang admits a request when its prompt plus this share of its budget fits the pool (0.7 at
    # first, decaying): near zero, it admits what the prompts allow, and the answers' growth must be
    # met by retracting, as a busy GPU server does late in a long run. Passed as a cluster user
    # passes any SGLANG_* setting.
    wd.config["engine"]["sglang"]["env"]["SGLANG_INIT_NEW_TOKEN_RATIO"] = "0.01"
    wd.set_sampling({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0})
    wd.config["model"]["context_length"] = CONTEXT
    wd.config["max_new_tokens"] = MAX_NEW_TOKENS
    wd.config["client"].update(concurrency="auto", max_concurrency=64, load_poll_s=0.2)
    wd.write_config()
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(wd.snakefile), "--directory", str(path)]
    proc = subprocess.Popen(
        cmd + ["--cores", "2", "results/train/train.jsonl", "results/summary.tsv"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=wd.env(),
    )
    watch = ProcessWatch(lambda: descendants(proc.pid))
    out, _ = proc.communicate(timeout=1800)
    wd.processes, wd.servers = watch.stop(), watch.servers()
    assert proc.returncode == 0, out[-8000:]
    return wd


def test_the_jobs_launched_and_stopped_real_sglang_servers(sglang_run):
    assert len(sglang_run.servers) == 2, sglang_run.processes  # one per generate job
    for category in ("math", "chat"):
        log = (sglang_run.path / "logs" / "generate" / category / "shard_0.server.log").read_text()
        assert "The server is fired up and ready to roll" in log
    # Nothing the jobs started outlives them: HTTP server, scheduler, detokenizer, watchdog.
    assert not alive(sglang_run.processes), {p: sglang_run.processes[p] for p in alive(sglang_run.processes)}


def test_every_row_is_transformers_greedy_continuation_on_the_same_weights(sglang_run, demo_model_dir):
    """The independent oracle: transformers' own greedy decoding on the same weights."""
    rows = [
        r
        for category in ("math", "chat")
        for r in read_rows(sglang_run.path / "results" / "generations" / f"{category}.parquet")
    ]
    checked = greedy_exact(rows, demo_model_dir)
    print(f"greedy-exact rows (later turn, tools, finish): {dict(checked)}")
    assert sum(checked.values()) >= 100, checked
    for what, seen in (("a later turn", lambda k: k[0]), ("a row with tools", lambda k: k[1])):
        assert any(seen(key) for key in checked), f"no {what} was checked: {checked}"
    assert {key[2] for key in checked} == {"stop", "length"}, checked


def test_kimi_k2_5s_tiktoken_tokenizer_on_the_real_server(tmp_path, demo_model_dir, kimi_tiktoken_dir):
    """Kimi-K2.5's tokenizer format (TikToken remote code, eos [EOS]) on the real server, loaded
    with --trust-remote-code as Kimi-K2.5 is served, beside the demo's weights (the same ids): with
    config/kimi-k2.5.yaml's model profile, the server's text agrees with the client's decode (the
    identity check), and every row is the greedy continuation, in thinking and in instant mode."""
    import yaml

    wd = Workdir(tmp_path, tokenizer=kimi_tiktoken_dir, model_dir=None, backend="scripted",
                 categories={"chat": demo_rows("chat", 20)}, mode_mix={"chat": "thinking:0.5,instant:0.5"})  # fmt: skip
    with open(ROOT / "config" / "kimi-k2.5.yaml") as fh:
        wd.config["model"] = dict(yaml.safe_load(fh)["model"], tokenizer=str(kimi_tiktoken_dir), context_length=CONTEXT)
    wd.set_sampling({"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0})
    wd.config["max_new_tokens"] = MAX_NEW_TOKENS
    extra = ["--tokenizer-path", str(kimi_tiktoken_dir), "--trust-remote-code"]
    with real_server(demo_model_dir, tmp_path / "real_sglang.log", extra=extra, context_length=CONTEXT) as url:
        wd.config["engine"] = {"kind": "external", "external": {"urls": [url]}}
        wd.write_config()
        wd.snakemake("--cores", "2", "results/train/train.jsonl")
    log = (tmp_path / "logs" / "generate" / "chat" / "shard_0.log").read_text()
    assert "first 8 answers agree with model.tokenizer" in log
    rows = read_rows(tmp_path / "results" / "generations" / "chat.parquet")
    checked = greedy_exact(rows, demo_model_dir)
    assert sum(checked.values()) >= 15 and any(key[1] for key in checked), checked
    # Both modes reached the server, each prompt ending as its mode's template ends it.
    think, end = 163606, 163607
    assert {r["mode"] for r in rows if r["status"] == "ok"} == {"thinking", "instant"}
    for r in (r for r in rows if r["status"] == "ok"):
        assert list(r["prompt_ids"][-2:]) == ([think, end] if r["mode"] == "instant" else [r["prompt_ids"][-2], think])


def test_exported_rows_hold_the_servers_tokens(sglang_run):
    for category in ("math", "chat"):
        generated = {
            (r["id"], r["sample_index"], r["turn"], r["mode"]): r
            for r in read_rows(sglang_run.path / "results" / "generations" / f"{category}.parquet")
        }
        exported = sglang_run.jsonl(f"results/dataset/{category}.jsonl")
        assert exported
        for row in exported:
            turns = [
                generated[(row["id"], row["sample_index"], t, row["mode"])]
                for t in range(row["turn"], row["turn"] + row["turns"])
            ]
            last = turns[-1]
            assert row["input_ids"] == list(last["prompt_ids"]) + list(last["output_ids"])
            assert [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m] == [
                t for turn in turns for t in turn["output_ids"]
            ]


def test_auto_concurrency_met_real_retractions_and_every_row_came_back_once(sglang_run):
    rows = [
        r
        for category in ("math", "chat")
        for r in read_rows(sglang_run.path / "results" / "generations" / f"{category}.parquet")
    ]
    keys = Counter((r["id"], r["sample_index"], r["turn"]) for r in rows)
    assert max(keys.values()) == 1
    assert all(r["status"] in ("ok", "skipped") for r in rows), Counter(r["status"] for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert sum(r["num_retractions"] for r in ok) > 0, "the small KV pool never made the server retract"
    # Later turns extend the earlier turn's prompt: the radix cache serves their shared prefix.
    later = [r for r in ok if r["turn"] > 0]
    assert any(r["cached_tokens"] > 0 for r in later), [r["cached_tokens"] for r in later]


JOB = textwrap.dedent(
    """
    import json, logging, sys, time
    from pathlib import Path
    from eagle3_datagen.generation.servers import servers, terminate_on_sigterm
    from eagle3_datagen.settings import ModelProfile, defaults

    logging.basicConfig(level=logging.INFO)
    engine, model_dir, log_path = defaults("engine", **json.loads(sys.argv[1])), sys.argv[2], Path(sys.argv[3])
    profile = ModelProfile.from_config({"name": "m", "tokenizer": model_dir, "stop_tokens": ["<|im_end|>"],
                                        "context_length": 2048})
    with terminate_on_sigterm(), servers(engine, profile=profile, log_path=log_path, key=None) as s:
        print("SERVING", s.urls[0], flush=True)
        time.sleep(3600)
    """
)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_killed_or_stopped_job_leaves_no_server_process(signal_name, tmp_path, demo_model_dir):
    import json

    engine = sglang_engine(demo_model_dir)
    cmd = [sys.executable, "-c", JOB, json.dumps(engine), str(demo_model_dir), str(tmp_path / "server.log")]
    env = {"PYTHONPATH": str(ROOT / "scripts"), "PATH": "/usr/bin:/bin"}
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_for_serving(job)
        stop_the_job(job, signal_name)
    finally:
        job.kill()  # whatever failed: the watchdog takes the server down with its job


def wait_for_serving(job: subprocess.Popen) -> None:
    lines = []
    try:
        wait_until(
            lambda: lines.append(job.stdout.readline()) or "SERVING" in lines[-1],
            "the job to report its server healthy",
            timeout_s=STARTUP_TIMEOUT_S + 60,
            process=job,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the job said:\n{''.join(lines)}") from None


def stop_the_job(job: subprocess.Popen, signal_name: str) -> None:
    import signal

    tree = descendants(job.pid)
    assert len(sglang_servers(tree)) == 1, tree
    assert len(tree) >= 4, tree  # watchdog, HTTP server, scheduler, detokenizer
    job.send_signal(getattr(signal, signal_name))
    job.wait(120)
    wait_until(lambda: not alive(tree), f"every server process gone after {signal_name} of its job", timeout_s=180)
    if signal_name == "SIGTERM":
        assert job.returncode == 128 + signal.SIGTERM
        assert "server stopped normally" in job.stdout.read()


def test_a_server_that_refuses_to_start_fails_the_job_with_its_reason(tmp_path, demo_model_dir):
    """SGLang's deterministic mode needs a GPU attention backend: on CPU the real server refuses to
    start, and the job says why (the server log's tail) instead of waiting out its start-up timeout."""
    import json

    engine = sglang_engine(demo_model_dir, deterministic=True)
    cmd = [sys.executable, "-c", JOB, json.dumps(engine), str(demo_model_dir), str(tmp_path / "server.log")]
    env = {"PYTHONPATH": str(ROOT / "scripts"), "PATH": "/usr/bin:/bin"}
    job = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=STARTUP_TIMEOUT_S)
    assert job.returncode != 0 and "SERVING" not in job.stdout
    assert "did not start" in job.stderr and "exited with code 1 during start-up" in job.stderr, job.stderr[-3000:]
    assert "deterministic" in job.stderr.split("did not start", 1)[1].lower(), job.stderr[-3000:]
