"""Resume, not restart: the GPU tokens a long answer costs when its stream is cut short, resumed from the
ids received against sent again from its start; the baseline (no cuts) in the same run.

The server is the local engine (`python -m eagle3_datagen.engine --backend scripted`, Qwen3 tokenizer)
behind its simulated GPU (`--step-ms`: every running request gets one token per step, so a long answer
takes time and a cut saves nothing already generated), streaming as SGLang does with
`--incremental-streaming-output`. Answers are long (`--answer-tokens`, default budget/4 to the budget).
Two engine sessions, each on one core (the client, this process, on the other):
  baseline  no faults: each answer generated once;
  cut       `--cut-rate` of the streams (every attempt's, drawn anew) dropped after a number of ids
            drawn uniformly over 1 to the budget (`--cut-after`): the connection closes, the engine
            aborts the request. Two client runs against it: `resume` (the client's default) and
            `restart` (client.resume false: what a cut cost before).
Figures:
  GPU tokens    output tokens the engine generated (its --record: every answer's ids, an aborted one's
                up to the abort), per run; over the baseline's. Goal: resume at most 1.05x the baseline.
  prompt tokens input ids sent (a resumed request sends the prompt and the ids received, which SGLang's
                prefix cache mostly holds), per run; over the baseline's.
  exactness     every row of the resume and restart runs is the baseline's row (same ids, same finish:
                the engine continues its own partial answer as a model does); checked, else exit 1.

    .venv/bin/python bench/resume.py [--requests 40] [--budget 32768] [--cut-rate 0.3] [--step-ms 0.2]
        [--stream-interval 32] [--smoke] [--figures /tmp/resume.json]
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
from eagle3_datagen.quality.loops import LoopSettings  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402

PROMPT_WORDS = "Prove that the sum of the first {i} odd numbers is a square, carefully."


def parse_args():
    p = BenchParser(__doc__, smoke={"requests": 6, "budget": 2048, "cut_rate": 0.5})
    add_options(p, requests=40)
    p.add_argument("--answer-tokens", help="LO:HI answer lengths (default budget/4:budget)")
    p.add_argument("--cut-rate", type=float, default=0.3, help="share of streams dropped mid-answer")
    p.add_argument("--cut-after", help="LO:HI ids streamed before a drop (default 1:budget)")
    return p.parse_args()


def engine_command(args, tok_dir: Path, port: int, record: Path, core: int, cut: bool) -> list[str]:
    answers = args.answer_tokens or f"{args.budget // 4}:{args.budget}"
    faults = ["--cut-rate", str(args.cut_rate), "--cut-after", args.cut_after or f"1:{args.budget}"] if cut else []
    return streamed_engine(args, tok_dir, port, record, core, answers) + faults


def run_client(url: str, template: RequestTemplate, reqs: list[Request], args, resume: bool) -> dict:
    settings = ClientSettings.from_config(
        concurrency=args.concurrency, resume=resume, max_retries=50, backoff_initial_s=0.05, backoff_max_s=0.5
    )
    live = LiveStop(loop=LoopSettings(), stream_interval=args.stream_interval)
    client = GenerateClient([url], template, settings, live=live)
    wall = time.monotonic()
    results = run_loop(client.run(reqs))
    failed = [r["error"] for r in results.values() if r["status"] != "ok"]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed: {failed[:3]}")
    return {"nonce": client.run_nonce, "results": dict(results), "wall_s": time.monotonic() - wall}


def spent(record: Path) -> dict:
    """Per run nonce: (output tokens generated, input tokens sent, requests), over every answer the
    engine ran (finished or aborted when its stream was dropped)."""
    out: dict = {}
    for r in read_record(record):
        if not r.get("rid") or r.get("input_ids") is None:
            continue
        tokens = out.setdefault(parse_rid(r["rid"]).nonce, [0, 0, 0])
        tokens[0] += len(r.get("output_ids") or ())
        tokens[1] += len(r["input_ids"])
        tokens[2] += 1
    return out


def main() -> None:
    args = parse_args()
    engine_core, tok_dir, reqs, template = setup(args, PROMPT_WORDS, first=2)
    started = time.monotonic()
    runs, tokens = {}, {}
    with tempfile.TemporaryDirectory(prefix="resume-") as tmp:
        for cut, names in ((False, {"baseline": True}), (True, {"resume": True, "restart": False})):
            record, port = Path(tmp) / f"record-{cut}.jsonl", free_port()
            cmd = engine_command(args, tok_dir, port, record, engine_core, cut)
            with ManagedServer(cmd, port=port, log_path=Path(tmp) / f"engine-{cut}.log") as url:
                for name, resume in names.items():
                    runs[name] = run_client(url, template, reqs, args, resume)
                    print(f"{name}: {runs[name]['wall_s']:.1f} s", flush=True)
            tokens.update(spent(record))
    base = runs["baseline"]["results"]
    problems = [
        f"{name} {key[0]}: not the baseline's answer"
        for name in ("resume", "restart")
        for key, row in runs[name]["results"].items()
        if row["output_ids"] != base[key]["output_ids"] or row["finish_type"] != base[key]["finish_type"]
    ]
    out = {}
    for name, run in runs.items():
        generated, prompt, sent = tokens[run["nonce"]]
        results = run["results"].values()
        out[name] = {
            "gpu_tokens": generated,
            "prompt_tokens": prompt,
            "requests_sent": sent,
            "rows_resumed": sum("resumed_at" in r for r in results),
            "resumes": sum(len(r.get("resumed_at", ())) for r in results),
            "wall_s": round(run["wall_s"], 1),
        }
    baseline = out["baseline"]
    summary = {
        "requests": args.requests,
        "budget": args.budget,
        "cut_rate": args.cut_rate,
        "stream_interval": args.stream_interval,
        "output_tokens": sum(len(r["output_ids"]) for r in base.values()),
        "resume_over_baseline": round(out["resume"]["gpu_tokens"] / baseline["gpu_tokens"], 4),
        "restart_over_baseline": round(out["restart"]["gpu_tokens"] / baseline["gpu_tokens"], 4),
        "prompt_tokens_resume_over_baseline": round(out["resume"]["prompt_tokens"] / baseline["prompt_tokens"], 2),
        "runs": out,
        "problems": problems,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    write_figures(args, summary)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
