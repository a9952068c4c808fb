"""Concurrency auto against a sweep of fixed values, on two server capacities.

Is `client.concurrency: auto` within 5 % of the best fixed value a sweep finds, on servers whose
capacity is bound by different things, and does a fixed value tuned on one lose on the other?

The engine (python -m eagle3_datagen.engine --backend scripted, Qwen3 tokenizer) runs its capacity
model of SGLang 0.5.23's scheduler: a simulated GPU whose steps are slept in real time, so the
figures follow the simulated step times rather than this machine's CPU (a step the engine's thread
starts late is time lost, so a busy CPU still takes a few per cent off). Answers vary per prompt:
lognormal reasoning lengths in 16:1000 tokens, 15 % of them rambling to max_new_tokens (1,024), so
a request's KV need is not known when it is admitted, and SGLang's admission estimate (new tokens
clipped to --clip-max-new-tokens-estimation, 128 here, times its decaying new-token ratio) lets the
batch outgrow the KV cache: the scheduler retracts requests, which wait again and prefill again.
Two capacities, one engine process each, kept for all its runs (NAME=R:K in --capacities for others):

  kv-bound     --max-running-requests 512 --max-total-tokens 24000: the KV cache holds ~33
               requests of ~340 prompt tokens and their answers (20-60 over a run); the slots never bind.
  slots-bound  --max-running-requests 96 --max-total-tokens 1000000: 96 requests decode at once,
               the KV cache never binds.

Each run sends the same ~340-token prompts (distinct, so each answer differs; the same requests in
every run, so every run generates the same tokens) through GenerateClient.run with a journal, at a
fixed concurrency from --sweep or at `auto` (max_concurrency 1024, load_poll_s 0.05: short against
a request's life, as 1 s is on a GPU server whose requests last minutes). Fixed runs poll the load
too (for the record only). The engine's prefix cache is flushed before every run.

Per run: steady throughput (output tokens completed between the 10 % and 90 % completion marks,
over the time between them; each completion stamped as the journal appends it), retractions (sum of
the answers' num_retractions) and rows retracted, the mean queue_time of the answers (the engine's
--enable-metrics), and, from GenerateClient.load_facts()["timeline"] between the same marks, the
mean and max of the client's limit and of the server's waiting queue. Also the whole run's tokens
over its wall time, and the simulated GPU's busy share of the wall time (from /v1/loads: prefill
busy time plus SGLang's decode moments, which leave out the first decode step after a prefill, so
it reads low; a run that lost time to the CPU reads lower still). A fixed value c sends
min(--requests, 20 c) requests: twenty answers per slot make a rate, and at c = 4 the full 600
would take a minute a run.

Runs are interleaved: each repeat runs the sweep and auto in an order shuffled with a fixed seed;
figures are medians over --repeats. Raw figures, auto's timelines included, go to --out.

    .venv/bin/python bench/concurrency.py [--requests 600] [--repeats 2] [--capacities kv-bound,slots-bound]
        [--sweep 4,8,16,24,32,48,64,96,128,256] [--out /tmp/concurrency.json]
"""

import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

import client_load  # noqa: E402
from client_load import SAMPLING, build_requests  # noqa: E402
from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.generation.client import GenerateClient  # noqa: E402
from eagle3_datagen.generation.journal import Journal  # noqa: E402
from eagle3_datagen.generation.requests import Request, RequestTemplate  # noqa: E402
from eagle3_datagen.generation.servers import ManagedServer, free_port  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402

# name: (--max-running-requests, --max-total-tokens)
CAPACITIES = {"kv-bound": (512, 24000), "slots-bound": (96, 1_000_000)}
SWEEP = (4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
ENGINE_FLAGS = [
    "--answer-tokens", "16:1000",
    "--answer-spread", "lognormal",
    "--clip-max-new-tokens-estimation", "128",
    "--step-ms", "1.0",
    "--step-ms-per-request", "0.01",
    "--step-us-per-kv-token", "0.01",
    "--enable-metrics",
]  # fmt: skip
MAX_NEW_TOKENS = 1024
REQUESTS_PER_SLOT = 20  # a fixed value c sends min(--requests, 20 c) requests
AUTO = "auto"


class StampingJournal(Journal):
    """The pipeline's journal, noting when each row was done and its output tokens."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.stamps: list[tuple[float, int]] = []

    def append(self, entry: dict) -> None:
        super().append(entry)
        self.stamps.append((time.monotonic(), len(entry.get("output_ids", ()))))


def engine(tok_dir: Path, port: int, log_dir: Path, running: int, total: int) -> ManagedServer:
    """The load benchmark's scripted engine with the capacity model of `running` slots and `total` KV tokens."""
    capacity = ("--max-running-requests", str(running), "--max-total-tokens", str(total), *ENGINE_FLAGS)
    return client_load.engine(tok_dir, port, log_dir, latency=None, extra=capacity)


def flush_cache(url: str) -> None:
    """Empty the engine's prefix cache (its worker does so within 0.1 s, once idle)."""
    with urllib.request.urlopen(urllib.request.Request(f"{url}/flush_cache", method="POST"), timeout=10):
        pass
    time.sleep(0.3)


def busy_us(url: str) -> float:
    """The simulated GPU's busy time so far, in us: prefill steps, and decode steps after a decode
    step (the first decode step after a prefill is not in SGLang's decode moments)."""
    with urllib.request.urlopen(f"{url}/v1/loads", timeout=10) as resp:
        load = json.loads(resp.read())["loads"][0]
    return load["total_prefill_busy_us"] + (load["decode_moments"] or [0.0] * 6)[2]


def at(points: list[tuple[float, int]], t: float):
    """The value of a step function (time, value) at time `t` (its first value before it starts)."""
    value = points[0][1] if points else None
    for ti, v in points:
        if ti > t:
            break
        value = v
    return value


def one_run(url: str, template: RequestTemplate, reqs: list[Request], tmp: Path, concurrency) -> dict:
    settings = {"concurrency": concurrency, "load_poll_s": 0.05, "progress_interval_s": 3600}
    if concurrency == AUTO:
        settings["max_concurrency"] = 1024
    client = GenerateClient([url], template, ClientSettings.from_config(**settings))
    flush_cache(url)
    journal = StampingJournal(tmp / f"j{time.monotonic_ns()}.jsonl")
    busy0, t0 = busy_us(url), time.monotonic()
    results = asyncio.run(client.run(reqs, journal))
    wall = time.monotonic() - t0
    busy = (busy_us(url) - busy0) / 1e6
    journal.close()
    assert all(r["status"] == "ok" for r in results.values()), "a request failed"
    n = len(journal.stamps)
    i10, i90 = math.ceil(0.1 * n) - 1, math.ceil(0.9 * n) - 1
    (t10, _), (t90, _) = journal.stamps[i10], journal.stamps[i90]
    window_tokens = sum(tok for _, tok in journal.stamps[i10 + 1 : i90 + 1])
    facts = client.load_facts()
    tl = facts["timeline"]
    # The timeline's times count from the load poller's start, a few ms after t0.
    times = [t0 + t for t in tl["t"]]
    inside = [k for k, t in enumerate(times) if t10 <= t <= t90]
    limit = [tl["limit"][k] for k in inside]
    waiting = [tl["waiting"][k] for k in inside if tl["waiting"][k] is not None]
    running = [tl["running"][k] for k in inside if tl["running"][k] is not None]
    limit_steps = list(zip(times, tl["limit"]))
    marks = {f"limit_at_{p}": at(limit_steps, journal.stamps[math.ceil(p / 100 * n) - 1][0]) for p in (10, 50, 90)}
    retractions = [r["num_retractions"] for r in results.values()]
    out = {
        "concurrency": concurrency,
        "requests": n,
        "wall_s": wall,
        "tokens": sum(tok for _, tok in journal.stamps),
        "steady_tps": window_tokens / (t90 - t10),
        "wall_tps": sum(tok for _, tok in journal.stamps) / wall,
        "busy_share": busy / wall,
        "window_s": t90 - t10,
        "retractions": sum(retractions),
        "rows_retracted": sum(1 for r in retractions if r),
        "retractions_per_1000": sum(retractions) / n * 1000,
        "queue_time_mean_s": statistics.mean(r["queue_time"] for r in results.values()),
        "cached_tokens_mean": statistics.mean(r["cached_tokens"] for r in results.values()),
        "limit_mean": statistics.mean(limit) if limit else None,
        "limit_max": max(limit) if limit else None,
        "waiting_mean": statistics.mean(waiting) if waiting else None,
        "waiting_max": max(waiting) if waiting else None,
        "running_mean": statistics.mean(running) if running else None,
        "polls": len(tl["t"]),
        "limit_cuts": facts["limit_cuts"],
        **marks,
    }
    if concurrency == AUTO:
        out["timeline"] = {k: tl[k] for k in ("t", "in_flight", "limit", "running", "waiting")}
    return out


def med(runs: list[dict], key: str):
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def label(c) -> str:
    return "auto" if c == AUTO else str(c)


def report(capacities: dict, runs: dict, sweep: list[int], args) -> tuple[list[str], dict]:
    lines: list[str] = []
    summary: dict = {}
    for name, (r, k) in capacities.items():
        by = {c: runs[name][c] for c in [*sweep, AUTO]}
        tps = {c: med(by[c], "steady_tps") for c in by}
        best = max(sweep, key=lambda c: tps[c])
        near = min(c for c in sweep if tps[c] >= 0.98 * tps[best])
        summary[name] = {"best": best, "best_tps": tps[best], "near": near, "tps": tps}
        lines += [
            f"### {name}: --max-running-requests {r} --max-total-tokens {k}",
            "",
            "| concurrency | requests | steady tok/s | × best | retractions / 1,000 answers | rows retracted "
            "| mean queue in the server | max queue | mean limit | mean queue_time s | wall s | tok/s, whole run "
            "| GPU busy |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in by:
            m = lambda key, c=c, by=by: med(by[c], key)  # noqa: E731
            name_c = f"**{label(c)}**" if c in (best, AUTO) else label(c)
            lines.append(
                f"| {name_c} | {m('requests'):.0f} | {m('steady_tps'):,.0f} | {m('steady_tps') / tps[best]:.3f} "
                f"| {m('retractions_per_1000'):.0f} | {m('rows_retracted'):.0f} | {m('waiting_mean'):.1f} "
                f"| {m('waiting_max'):.0f} | {m('limit_mean'):.1f} | {m('queue_time_mean_s'):.3f} | {m('wall_s'):.1f} "
                f"| {m('wall_tps'):,.0f} | {m('busy_share'):.0%} |"
            )
        auto = by[AUTO]
        ratio = tps[AUTO] / tps[best]
        each = ", ".join(f"{a['steady_tps'] / tps[best]:.3f}" for a in auto)
        lines += [
            "",
            f"best fixed: {best} ({tps[best]:,.0f} tok/s); least within 2 % of it: {near}; "
            f"auto: {tps[AUTO]:,.0f} tok/s = **{ratio:.3f}× the best** (goal ≥ 0.95; each repeat: {each})",
            "auto's limit at the 10 / 50 / 90 % completion marks, each repeat: "
            + "; ".join(f"{a['limit_at_10']} / {a['limit_at_50']} / {a['limit_at_90']}" for a in auto)
            + f"; mean {med(auto, 'limit_mean'):.1f}, max {med(auto, 'limit_max'):.0f}, "
            f"the server running {med(auto, 'running_mean'):.1f} on average (median of the repeats)",
            "",
        ]
        summary[name]["auto_ratio"] = ratio
    names = list(capacities)
    if len(names) == 2:
        lines += [
            "### cross check: the least fixed value within 2 % of the best on one capacity, run on the other",
            "",
            "| tuned on | value | run on | its steady tok/s | auto there | ÷ auto | ÷ best fixed there |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for a, b in (names, names[::-1]):
            v = summary[a]["near"]
            there = summary[b]["tps"]
            lines.append(
                f"| {a} | {v} | {b} | {there[v]:,.0f} | {there[AUTO]:,.0f} | {there[v] / there[AUTO]:.3f} "
                f"| {there[v] / summary[b]['best_tps']:.3f} |"
            )
            summary[a]["cross"] = {"value": v, "on": b, "ratio_to_auto": there[v] / there[AUTO]}
        lines.append("")
    return lines, summary


def main() -> None:
    parser = BenchParser(
        __doc__, smoke={"requests": 24, "repeats": 1, "sweep": "16", "out": "/tmp/concurrency-smoke.json"}
    )
    parser.add_argument("--requests", type=int, default=600, help="requests per run (a fixed c: at most 20 c)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--capacities",
        default=",".join(CAPACITIES),
        help="comma-separated: kv-bound, slots-bound, or NAME=R:K (--max-running-requests R --max-total-tokens K)",
    )
    parser.add_argument("--sweep", default=",".join(map(str, SWEEP)), help="fixed concurrencies")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order")
    parser.add_argument("--out", default="/tmp/concurrency.json", help="raw results, JSON")
    args = parser.parse_args()
    capacities = {}
    for spec in args.capacities.split(","):
        name, _, value = spec.partition("=")
        capacities[name] = tuple(int(x) for x in value.split(":")) if value else CAPACITIES[name]
    sweep = [int(x) for x in args.sweep.split(",")]
    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    template = RequestTemplate(dict(SAMPLING), stop, len(tokenizer))
    reqs = build_requests(tokenizer, args.requests, MAX_NEW_TOKENS)
    warmup = build_requests(tokenizer, args.requests + 50, MAX_NEW_TOKENS)[args.requests :]
    prompt_len = statistics.mean(len(r.prompt_ids) for r in reqs)
    runs: dict[str, dict] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, (r, k) in capacities.items():
            runs[name] = {c: [] for c in [*sweep, AUTO]}
            with engine(tok_dir, free_port(), tmp, r, k) as url:
                one_run(url, template, warmup, tmp, 16)  # warm-up: connections, the engine's tokenizer
                for rep in range(args.repeats):
                    order = [*sweep, AUTO]
                    random.Random(f"{args.seed}-{name}-{rep}").shuffle(order)
                    for c in order:
                        n = args.requests if c == AUTO else min(args.requests, REQUESTS_PER_SLOT * c)
                        run = one_run(url, template, reqs[:n], tmp, c)
                        runs[name][c].append(run)
                        print(
                            f"  {name} repeat {rep + 1} {label(c):>5}: {run['steady_tps']:8,.0f} tok/s, "
                            f"{run['retractions']:4d} retractions, queue {run['waiting_mean'] or 0:6.1f}, "
                            f"{run['wall_s']:5.1f} s, busy {run['busy_share']:.0%}",
                            file=sys.stderr,
                            flush=True,
                        )
    total = time.monotonic() - started
    lines, summary = report(capacities, runs, sweep, args)
    head = [
        f"## concurrency auto against a sweep of fixed values: {args.requests} requests per run "
        f"(a fixed c: at most {REQUESTS_PER_SLOT} c), ~{prompt_len:.0f}-token prompts, max_new_tokens "
        f"{MAX_NEW_TOKENS}, median of {args.repeats}, {total / 60:.1f} min in all",
        "",
        "engine: " + " ".join(ENGINE_FLAGS),
        "",
    ]
    print("\n".join(head + lines))
    out = {
        "args": vars(args),
        "engine_flags": ENGINE_FLAGS,
        "capacities": capacities,
        "prompt_tokens_mean": prompt_len,
        "total_s": total,
        "summary": {n: {**s, "tps": {label(c): v for c, v in s["tps"].items()}} for n, s in summary.items()},
        "runs": {n: {label(c): rs for c, rs in by.items()} for n, by in runs.items()},
    }
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"raw results: {args.out}")
    write_figures(
        args,
        {
            "requests": args.requests,
            "repeats": args.repeats,
            "capacities": out["summary"],
            "total_s": round(total, 1),
        },
    )


if __name__ == "__main__":
    main()
