"""Live loop stop: the GPU tokens a repetition loop costs with and without the client stopping it while
it is generated, and what streaming costs the client; the baseline (not streamed) in the same run.

The server is the local engine (`python -m eagle3_datagen.engine --backend scripted`, Qwen3 tokenizer)
behind its simulated GPU (`--max-running-requests`, `--max-total-tokens`, `--step-ms`: every running
request gets one token per step, so tokens are spent in time and an abort saves the rest), streaming
as SGLang does with `--incremental-streaming-output`, and with loop injection: `--loop-share` of the
requests (drawn per row, the same rows in every run) fall into a loop of period `--loop-period` from an
onset drawn uniformly over `--loop-onset` (default 1,024 to budget - 2,048 tokens) and loop until
max_new_tokens. The other requests end at a length drawn over `--answer-tokens` or at the budget. The
engine runs on one core and the client (in this process) on the other (`taskset`).

Three client runs over the same requests, each with a fresh run nonce:
  whole   not streamed (the client before the live stop): the baseline;
  live    streamed, each chunk watched, a loop stopped with /abort_request (the config's quality
          defaults);
  stream  streamed and watched, with loop settings none of these outputs meets (`max_period` 1: only a
          token repeated 256 times): what streaming costs the client, with the watch at its cheapest.
Figures:
  GPU tokens   output tokens the engine generated (its --record: each answer's ids, an aborted one's
               up to the abort), on looping and on loop-free requests, and on the looping ones from
               their onset on ("in loops": what the loop wasted); saved = 1 - live / whole. Goal: at
               least 80 % of the tokens in loops saved. The tokens before a loop's onset are spent
               either way, so on whole looping requests the saving is about 1 - mean onset / budget.
  exactness    in the live run, every loop-free request ends as in the whole run (same ids, no `loop`
               finish), and every stopped one holds a prefix of its whole-run ids (checked, else exit 1).
  client CPU   time.process_time of this process over `GenerateClient.run` (on uvloop, as the generate
               job runs it: `client.run_loop`), per request and per 1,000 output tokens received.

The scripted engine writes long answers from copies of one paragraph, each turned at a random point
(`AnswerScript.long_words`), so no loop-free answer repeats with any period for long.

    .venv/bin/python bench/live_stop.py [--requests 60] [--budget 32768] [--loop-share 0.2]
        [--step-ms 0.2] [--stream-interval 32] [--smoke] [--figures /tmp/live_stop.json]
"""

import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures
from _streamed import add_options, setup
from _streamed import engine_command as streamed_engine

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.engine.server import read_record  # noqa: E402
from eagle3_datagen.generation.client import GenerateClient, run_loop  # noqa: E402
from eagle3_datagen.generation.requests import Request, RequestTemplate, parse_rid  # noqa: E402
from eagle3_datagen.generation.servers import ManagedServer, free_port  # noqa: E402
from eagle3_datagen.generation.streaming import LiveStop  # noqa: E402
from eagle3_datagen.quality.flags import LOOP_FINISH  # noqa: E402
from eagle3_datagen.quality.loops import LoopSettings  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402

PROMPT_WORDS = "Explain how a heap keeps its order after an insertion, step by step, for case {i}."


def parse_args():
    p = BenchParser(__doc__, smoke={"requests": 6, "budget": 4096, "loop_share": 0.5})
    add_options(p, requests=60)
    p.add_argument("--loop-share", type=float, default=0.2)
    p.add_argument("--loop-onset", help="LO:HI output tokens before a loop (default 1024:budget-2048)")
    p.add_argument("--loop-period", default="2:48")
    p.add_argument("--answer-tokens", help="LO:HI lengths of loop-free answers (default budget/8:budget)")
    return p.parse_args()


def engine_command(args, tok_dir: Path, port: int, record: Path, core: int) -> list[str]:
    onset = args.loop_onset or f"1024:{args.budget - 2048}"
    answers = args.answer_tokens or f"{args.budget // 8}:{args.budget}"
    loops = ["--loop-share", str(args.loop_share), "--loop-onset", onset, "--loop-period", args.loop_period]
    return streamed_engine(args, tok_dir, port, record, core, answers) + loops


def run_client(url: str, template: RequestTemplate, reqs: list[Request], concurrency: int, live) -> dict:
    client = GenerateClient([url], template, ClientSettings.from_config(concurrency=concurrency), live=live)
    wall, cpu = time.monotonic(), time.process_time()
    results = run_loop(client.run(reqs))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    failed = [r["error"] for r in results.values() if r["status"] != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[:3]}")
    return {"nonce": client.run_nonce, "results": dict(results), "cpu_s": cpu, "wall_s": wall}


def engine_tokens(record: Path) -> dict:
    """Per run nonce, per row: (output tokens generated, the loop's onset where the engine made it loop)."""
    out: dict = {}
    for r in read_record(record):
        if r.get("status") != 200 or not r.get("rid"):
            continue
        sent = parse_rid(r["rid"])
        loop = r.get("loop")
        out.setdefault(sent.nonce, {})[sent.row] = (len(r["output_ids"]), None if loop is None else int(loop["onset"]))
    return out


def check_exact(whole: dict, live: dict, looping: set) -> list[str]:
    """What in the live run is not what the whole run says it must be."""
    problems = []
    for row, w in whole.items():
        got = live[row]
        if row in looping:
            if got["output_ids"] != w["output_ids"][: len(got["output_ids"])]:
                problems.append(f"{row}: the stopped ids are not a prefix of the whole run's")
        elif got["finish_type"] == LOOP_FINISH or got["output_ids"] != w["output_ids"]:
            problems.append(f"{row}: a loop-free request ended otherwise than in the whole run ({got['finish_type']})")
    return problems


def figures(runs: dict, tokens: dict) -> dict:
    out = {}
    for name, run in runs.items():
        spent = tokens[run["nonce"]]
        received = sum(len(r["output_ids"]) for r in run["results"].values())
        n = len(run["results"])
        out[name] = {
            "gpu_tokens_looping": sum(t for t, onset in spent.values() if onset is not None),
            "gpu_tokens_in_loops": sum(max(0, t - onset) for t, onset in spent.values() if onset is not None),
            "gpu_tokens_loop_free": sum(t for t, onset in spent.values() if onset is None),
            "stopped_as_loop": sum(r["finish_type"] == LOOP_FINISH for r in run["results"].values()),
            "tokens_received": received,
            "cpu_ms_per_request": round(1000 * run["cpu_s"] / n, 2),
            "cpu_ms_per_1k_tokens": round(1000 * run["cpu_s"] / max(received, 1) * 1000, 3),
            "wall_s": round(run["wall_s"], 1),
        }
    return out


def main() -> None:
    args = parse_args()
    engine_core, tok_dir, reqs, template = setup(args, PROMPT_WORDS)
    loop = LoopSettings()
    clients = {
        "whole": None,
        "live": LiveStop(loop=loop, stream_interval=args.stream_interval),
        "stream": LiveStop(loop=LoopSettings(max_period=1), stream_interval=args.stream_interval),
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="live_stop-") as tmp:
        record, port = Path(tmp) / "record.jsonl", free_port()
        cmd = engine_command(args, tok_dir, port, record, engine_core)
        with ManagedServer(cmd, port=port, log_path=Path(tmp) / "engine.log") as url:
            runs = {}
            for name, live in clients.items():
                runs[name] = run_client(url, template, reqs, args.concurrency, live)
                print(f"{name}: {runs[name]['wall_s']:.1f} s", flush=True)
        tokens = engine_tokens(record)
    looping = {row for row, (_, onset) in tokens[runs["whole"]["nonce"]].items() if onset is not None}
    problems = check_exact(runs["whole"]["results"], runs["live"]["results"], looping)
    problems += check_exact(runs["whole"]["results"], runs["stream"]["results"], set())
    out = figures(runs, tokens)
    saved = 1 - out["live"]["gpu_tokens_looping"] / max(out["whole"]["gpu_tokens_looping"], 1)
    saved_in_loops = 1 - out["live"]["gpu_tokens_in_loops"] / max(out["whole"]["gpu_tokens_in_loops"], 1)
    summary = {
        "requests": args.requests,
        "looping_requests": len(looping),
        "budget": args.budget,
        "loop_settings": loop.to_json(),
        "stream_interval": args.stream_interval,
        "saved_in_loops": round(saved_in_loops, 4),
        "saved_on_looping_requests": round(saved, 4),
        "loop_free_stopped": sum(
            runs["live"]["results"][row]["finish_type"] == LOOP_FINISH
            for row in runs["whole"]["results"]
            if row not in looping
        ),
        "cpu_stream_over_whole": round(out["stream"]["cpu_ms_per_request"] / out["whole"]["cpu_ms_per_request"], 2),
        "cpu_live_over_whole": round(out["live"]["cpu_ms_per_request"] / out["whole"]["cpu_ms_per_request"], 2),
        "runs": out,
        "problems": problems,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    write_figures(args, summary)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
