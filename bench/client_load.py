"""Client load: how fast the generate client can go, and whether it keeps the server's batch full.

The engine runs as its own process (python -m eagle3_datagen.engine --backend scripted) on loopback,
sharing the machine's cores with this one; the client's CPU time is time.process_time of this process.
Every client run writes the journal, as the pipeline's generate rule does.

(a) Throughput against the engine with no added latency: requests/s, tokens/s and client CPU seconds
    per 1,000 requests, for short answers (up to 256 tokens, the scripted mix) and for long ones
    (every answer exactly --long-tokens tokens: ignore_eos). 1000 / (CPU s per 1,000 requests) is the
    request rate at which the client alone would fill one core; it is compared, as a ratio, with the
    rate a GPU server finishes long answers (--server-rps, default 5 and 20 requests/s: an 8xH200
    Kimi-K2.5 server).

(b) Occupancy against the engine with an added latency drawn uniformly from --latency-ms (a realistic
    spread of answer times, scaled down), for short answers at --concurrency and for long ones at
    --long-concurrency (the engine's own CPU bounds that one here). The window runs from the first
    moment `concurrency` requests are on the wire until N - concurrency rows are done (until then,
    at least one request still waits in the client's queue). Three views of the runs:
      client counter  time-weighted, from every change of GenerateClient.in_flight;
      sampled 5 ms    GenerateClient.in_flight read every 5 ms by a task in the same event loop;
      on the wire     time-weighted count of requests handed to their connection whose answer was
                      not yet read whole (wrappers around aiohttp's request and read): what the server holds.
    For each: the share of the window at `concurrency` (the goal is at least 99 %), the mean level
    over `concurrency`, and the gap per request (the time-integral of the shortfall divided by the
    requests finished: how long each answer leaves its slot empty before the next request goes
    out). Since each finished request empties its slot for about that long, a server finishing R
    requests/s would see the slots all full a share of about 1 - R x gap; that is given for the
    --server-rps rates. Last, the client's CPU per request by step, on one real answer of each kind.

(c) Multi-turn occupancy (`turns: all`): conversations of --turns user turns, each turn's prompt
    made by the pipeline's own `turns.TurnBuilder` from the answer to the turn before (decoded,
    parsed, re-rendered and tokenized with the real Qwen3 tokenizer, in the client's follow-up
    thread) and sent as soon as that answer is journalled, against the same latency as (b). The
    window runs from the first moment `concurrency` requests are on the wire until the last new
    conversation has been started: until then a free slot always has work (a later turn, or a
    new conversation). After it, only the remaining turns of the conversations in flight are
    left, one at a time each: that tail is reported apart.

    .venv/bin/python bench/client_load.py [--requests 2000] [--repeats 3] [--part a|b|c|all]
"""

import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import aiohttp  # noqa: E402

from _harness import ROOT, BenchParser, write_figures  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.generation.answers import parse_response  # noqa: E402
from eagle3_datagen.generation.client import GenerateClient  # noqa: E402
from eagle3_datagen.generation.journal import Journal  # noqa: E402
from eagle3_datagen.generation.requests import Request, RequestTemplate  # noqa: E402
from eagle3_datagen.generation.servers import ManagedServer, free_port  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402
from eagle3_datagen.storage.prompts import read_prompts  # noqa: E402

SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def demo_texts() -> list[str]:
    texts = []
    for path in sorted((ROOT / "config" / "prompts").glob("*.jsonl")):
        for row in read_prompts(path):
            texts += [m["content"] for m in row.messages if m["role"] == "user"] if row.ok else []
    return texts


def build_requests(tokenizer, n: int, max_new_tokens: int, prompt_tokens: int = 300) -> list[Request]:
    """Prompts of about `prompt_tokens` tokens, made of the demo prompts' user texts, each distinct."""
    texts = demo_texts()
    out = []
    for i in range(n):
        parts, k = [f"Request {i}."], i
        while sum(len(p) for p in parts) < prompt_tokens * 4:
            parts.append(texts[k % len(texts)])
            k += 7
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": "\n\n".join(parts)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        out.append(Request(f"r-{i}", 0, ids[: prompt_tokens + 40], max_new_tokens, seed=i, fingerprint=str(i)))
    return out


class CountingJournal(Journal):
    """The pipeline's journal, also noting when the first `mark` rows were done."""

    def __init__(self, path: Path, mark: int):
        super().__init__(path)
        self.done, self.mark, self.mark_time = 0, mark, None
        self.append_s = self.sync_s = 0.0
        self.syncs = 0

    def sync(self) -> None:
        t = time.perf_counter()
        super().sync()
        self.sync_s += time.perf_counter() - t
        self.syncs += 1

    def append(self, entry: dict) -> None:
        t = time.perf_counter()
        super().append(entry)
        self.append_s += time.perf_counter() - t
        self.done += 1
        if self.done == self.mark:
            self.mark_time = time.perf_counter()


class RecordingClient(GenerateClient):
    """GenerateClient with every change of `in_flight` recorded as (time, value)."""

    def __init__(self, *args, **kwargs):
        self.changes: list[tuple[float, int]] = []
        super().__init__(*args, **kwargs)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self._in_flight = value
        self.changes.append((time.perf_counter(), value))


@contextmanager
def traced_sessions(changes: list[tuple[float, int]]):
    """Every /generate request the client makes records its time on the wire: from the request
    handed to aiohttp (`ClientSession._request`) to its answer read whole (`ClientResponse.read`)."""
    state = {"n": 0}
    real_request, real_read = aiohttp.ClientSession._request, aiohttp.ClientResponse.read

    def note(step: int) -> None:
        state["n"] += step
        changes.append((time.perf_counter(), state["n"]))

    async def request(self, method, url, *args, **kwargs):
        generate = str(url).endswith("/generate")
        if generate:
            note(+1)
        try:
            return await real_request(self, method, url, *args, **kwargs)
        except BaseException:
            if generate:
                note(-1)
            raise

    async def read(self):
        try:
            return await real_read(self)
        finally:
            if self.url.path.endswith("/generate"):
                note(-1)

    aiohttp.ClientSession._request, aiohttp.ClientResponse.read = request, read
    try:
        yield
    finally:
        aiohttp.ClientSession._request, aiohttp.ClientResponse.read = real_request, real_read


def share_at(changes: list[tuple[float, int]], level: int, t0: float, t1: float) -> float:
    """Share of [t0, t1] during which a step function (time, value) is at least `level`."""
    if t1 <= t0:
        return float("nan")
    at, value, last = 0.0, 0, t0
    for t, v in changes:
        if t > t0:
            if value >= level:
                at += min(t, t1) - last
            last = min(t, t1)
        value = v
        if t >= t1:
            break
    if value >= level and last < t1:
        at += t1 - last
    return at / (t1 - t0)


def engine(tok_dir: Path, port: int, log_dir: Path, latency: str | None, extra: tuple[str, ...] = ()) -> ManagedServer:
    """The scripted engine on loopback (Qwen3 tokenizer), with an added latency and `extra` flags."""
    cmd = [
        sys.executable,
        "-m",
        "eagle3_datagen.engine",
        "--backend",
        "scripted",
        "--model-dir",
        str(tok_dir),
        "--tokenizer-dir",
        str(tok_dir),
        "--port",
        str(port),
        "--context-length",
        "32768",
        *extra,
        "--log-level",
        "WARNING",
    ]
    if latency:
        cmd += ["--latency-ms", latency]
    return ManagedServer(cmd, port=port, log_path=log_dir / f"engine-{port}.log")


def throughput_run(url: str, template: RequestTemplate, reqs: list[Request], tmp: Path, concurrency: int) -> dict:
    client = GenerateClient(
        [url], template, ClientSettings.from_config(concurrency=concurrency, progress_interval_s=3600)
    )
    journal = Journal(tmp / f"j{time.monotonic_ns()}.jsonl")
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = asyncio.run(client.run(reqs, journal))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    journal.close()
    assert all(r["status"] == "ok" for r in results.values()), "a request failed"
    tokens = sum(len(r["output_ids"]) for r in results.values())
    return {
        "rps": len(reqs) / wall,
        "tps": tokens / wall,
        "cpu_per_1000": cpu / len(reqs) * 1000,
        "tokens_per_req": tokens / len(reqs),
    }


def occupancy_run(
    url: str, template: RequestTemplate, reqs: list[Request], tmp: Path, concurrency: int, interval_s: float = 0.005
) -> dict:
    n, c = len(reqs), concurrency
    client = RecordingClient([url], template, ClientSettings.from_config(concurrency=c, progress_interval_s=3600))
    journal = CountingJournal(tmp / f"j{time.monotonic_ns()}.jsonl", mark=n - c)
    wire: list[tuple[float, int]] = []
    samples: list[int] = []
    lateness: list[float] = []

    async def main():
        async def sampler():
            # Sample only while requests remain queued: after the first time `c` are in flight,
            # until n - c rows are done.
            while client.in_flight < c:
                await asyncio.sleep(0)
            while journal.done < n - c:
                t = time.perf_counter()
                await asyncio.sleep(interval_s)
                lateness.append(time.perf_counter() - t - interval_s)
                if journal.done < n - c:
                    samples.append(client.in_flight)

        task = asyncio.create_task(sampler())
        results = await client.run(reqs, journal)
        await task
        return results

    with traced_sessions(wire):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        results = asyncio.run(main())
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    journal.close()
    assert all(r["status"] == "ok" for r in results.values()), "a request failed"
    # The window: from the first moment `c` requests are on the wire (after the run's connections
    # are opened) until fewer than `c` remain to be done.
    t_counter = next(t for t, v in client.changes if v >= c)
    t0 = next(t for t, v in wire if v >= c)
    t1 = journal.mark_time
    finished = sum(1 for t, v in wire[1:] if t0 < t <= t1) // 2  # each request: one start, one end
    out = {
        "rps": n / wall,
        "cpu_share": cpu / wall,
        "window_s": t1 - t0,
        "ramp_ms": (t0 - t_counter) * 1000,
        "sampled": sum(s >= c for s in samples) / len(samples),
        "samples": len(samples),
        "late_ms": statistics.median(lateness) * 1000,
        "journal_ms": journal.append_s / journal.done * 1000,
        "fsync_ms": journal.sync_s / max(journal.syncs, 1) * 1000,
        "syncs": journal.syncs,
    }
    for name, changes in (("counter", client.changes), ("wire", wire)):
        mean = mean_level(changes, t0, t1)
        out[name] = share_at(changes, c, t0, t1)
        out[name + "_mean"] = mean / c
        # The time-integral of (c - level) is the time requests spend off the counter (or off the
        # wire) between one answer and the next request; per finished request:
        out[name + "_gap_ms"] = (c - mean) * (t1 - t0) / max(finished, 1) * 1000
    return out


def cpu_breakdown(url: str, client: GenerateClient, req: Request, tmp: Path, repeats: int = 200) -> dict:
    """Per-request CPU of the client's own steps on one real answer, in ms (median of `repeats`)."""
    import urllib.request

    body = {"input_ids": req.prompt_ids, "sampling_params": client.template.sampling_params(req), "rid": "breakdown"}
    http = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(http, timeout=120) as resp:
        text = resp.read().decode()
    journal = Journal(tmp / f"breakdown{time.monotonic_ns()}.jsonl", sync_every=10**9, sync_interval_s=1e9)
    data = json.loads(text)
    result = parse_response(data, req, client.template.vocab_size)
    steps = {
        "request body json.dumps": lambda: json.dumps(body),
        "answer json.loads": lambda: json.loads(text),
        "parse_response": lambda: parse_response(data, req, client.template.vocab_size),
        "journal append (no fsync)": lambda: journal.append(
            {
                "id": req.id,
                "sample_index": 0,
                "fingerprint": req.fingerprint,
                **result,
                "status": "ok",
                "error": "",
                "attempts": 1,
            }
        ),
    }
    out = {"n_output": len(data["output_ids"]), "answer_kb": len(text) / 1024}
    for name, fn in steps.items():
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1000
    journal.close()
    return out


def mean_level(changes: list[tuple[float, int]], t0: float, t1: float) -> float:
    total, value, last = 0.0, 0, t0
    for t, v in changes:
        if t > t0:
            total += value * (min(t, t1) - last)
            last = min(t, t1)
        value = v
        if t >= t1:
            break
    total += value * max(t1 - last, 0.0)
    return total / (t1 - t0)


def conversation_rows(tokenizer, profile, n: int, turns: int, max_new_tokens: int) -> list[dict]:
    """Prompts rows of `n` conversations of `turns` user turns (demo prompts' user texts; the
    original answers between them are placeholders the regenerated ones replace)."""
    from eagle3_datagen.generation.turns import turn_ends
    from eagle3_datagen.tokens.templating import ChatTokenizer

    texts = demo_texts()
    chat = ChatTokenizer(tokenizer, profile)
    rows = []
    for i in range(n):
        messages = []
        for k in range(turns):
            if k:
                messages.append({"role": "assistant", "content": f"Answer {k}."})
            messages.append(
                {"role": "user", "content": f"Conversation {i}, turn {k}: {texts[(7 * i + k) % len(texts)]}"}
            )
        ends = turn_ends(messages, "all")
        prompt_ids = chat.tokenize([messages[: ends[0]]], [None])[0].prompt_ids
        rows.append(
            {
                "id": f"c-{i}",
                "sample_index": 0,
                "status": "ok",
                "messages": json.dumps(messages),
                "tools": "",
                "turn_ends": ends,
                "prompt_ids": prompt_ids,
                "max_new_tokens": max_new_tokens,
                "seed": i,
            }
        )
    return rows


def multi_turn_run(url: str, builder, rows: list[dict], tmp: Path, concurrency: int) -> dict:
    """One multi-turn run: (c) of the module doc. Rows of one turn each make the baseline: the same
    client without follow-ups."""
    from eagle3_datagen.generation.planning import requests_to_send
    from eagle3_datagen.generation.turns import follower

    c = concurrency
    client = RecordingClient(
        [url], builder.template, ClientSettings.from_config(concurrency=c, progress_interval_s=3600)
    )
    journal = CountingJournal(tmp / f"j{time.monotonic_ns()}.jsonl", mark=-1)
    wire: list[tuple[float, int]] = []
    in_flight: dict = {}
    drawn = {"last_new": None, "follow_s": 0.0, "follows": 0}

    def source():
        yield from requests_to_send(rows, builder, None, in_flight)
        drawn["last_new"] = time.perf_counter()

    pipeline_follow = follower(in_flight)

    def follow(req, result):  # the pipeline's own follow-up, timed
        t = time.perf_counter()
        following = pipeline_follow(req, result)
        drawn["follow_s"] += time.perf_counter() - t
        drawn["follows"] += 1
        return following

    with traced_sessions(wire):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        multi = any(len(r["turn_ends"]) > 1 for r in rows)
        results = asyncio.run(client.run(source(), journal, total=len(rows), follow=follow if multi else None))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    journal.close()
    assert all(r["status"] == "ok" for r in results.values()), "a request failed"
    t0 = next(t for t, v in wire if v >= c)
    t1 = drawn["last_new"]
    t_end = wire[-1][0]
    out = {
        "requests": len(results),
        "rps": len(results) / wall,
        "cpu_share": cpu / wall,
        "window_s": t1 - t0,
        "tail_s": t_end - t1,
        "follow_ms": drawn["follow_s"] / max(drawn["follows"], 1) * 1000,
        "turns_per_conv": len(results) / len(rows),
    }
    finished = sum(1 for t, v in wire[1:] if t0 < t <= t1) // 2  # each request: one start, one end
    for name, changes in (("counter", client.changes), ("wire", wire)):
        mean = mean_level(changes, t0, t1)
        out[name] = share_at(changes, c, t0, t1)
        out[name + "_mean"] = mean / c
        out[name + "_gap_ms"] = (c - mean) * (t1 - t0) / max(finished, 1) * 1000
    return out


SMOKE = {
    **{"requests": 24, "long_requests": 4, "long_tokens": 512, "repeats": 1, "concurrency": 4},
    **{"latency_ms": "5:20", "occupancy_requests": 24, "occupancy_long_requests": 6, "long_concurrency": 2},
    **{"conversations": 8, "turns": 2},
}


def medians(runs: list[dict]) -> dict:
    """The median of each numeric figure over the repeats."""
    return {
        k: round(statistics.median(r[k] for r in runs), 4)
        for k, v in runs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def main() -> None:
    parser = BenchParser(__doc__, smoke=SMOKE)
    parser.add_argument("--part", choices=("a", "b", "c", "both", "all"), default="all", help="both: a and b")
    parser.add_argument("--requests", type=int, default=2000, help="requests per run of (a), short answers")
    parser.add_argument("--long-requests", type=int, default=300, help="requests per run of (a), long answers")
    parser.add_argument("--long-tokens", type=int, default=4096, help="output tokens of every long answer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency-ms", default="5:600", help="(b): added server latency LO:HI, uniform")
    parser.add_argument("--occupancy-requests", type=int, default=2500, help="requests per run of (b), short answers")
    parser.add_argument(
        "--occupancy-long-requests", type=int, default=500, help="requests per run of (b), long answers"
    )
    parser.add_argument(
        "--long-concurrency",
        type=int,
        default=16,
        help="(b): concurrency with long answers (the engine's CPU bounds it here)",
    )
    parser.add_argument("--server-rps", default="5,20", help="GPU server request rates to compare with")
    parser.add_argument("--conversations", type=int, default=400, help="(c): conversations per run")
    parser.add_argument("--turns", type=int, default=4, help="(c): user turns per conversation")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    short_template = RequestTemplate(dict(SAMPLING), stop, len(tokenizer))
    long_template = RequestTemplate({**SAMPLING, "ignore_eos": True}, stop, len(tokenizer))
    c = args.concurrency
    figures = {"repeats": args.repeats, "concurrency": c, "throughput": None, "occupancy": None, "multi_turn": None}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.part in ("a", "both", "all"):
            short = build_requests(tokenizer, args.requests, 256)
            long = build_requests(tokenizer, args.long_requests, args.long_tokens)
            port = free_port()
            runs: dict[str, list[dict]] = {"short": [], "long": []}
            with engine(tok_dir, port, tmp, None) as url:
                throughput_run(url, short_template, short[:200], tmp, c)  # warm-up
                for _ in range(args.repeats):
                    runs["short"].append(throughput_run(url, short_template, short, tmp, c))
                    runs["long"].append(throughput_run(url, long_template, long, tmp, c))
            med = lambda name, k: statistics.median(r[k] for r in runs[name])  # noqa: E731
            rates = [float(x) for x in args.server_rps.split(",")]
            prompt_len = statistics.mean(len(r.prompt_ids) for r in short)
            print(
                f"(a) throughput, zero added latency, concurrency {c}, ~{prompt_len:.0f}-token prompts, journal on, median of {args.repeats}"
            )
            print(
                f"{'answers':16}{'requests':>9}{'tok/req':>9}{'req/s':>9}{'tok/s':>11}{'CPU s/1000 req':>16}{'1-core limit req/s':>20}"
                + "".join(f"{f'vs {r:g} req/s':>14}" for r in rates)
            )
            for name, n in (("short (<=256)", len(short)), (f"long ({args.long_tokens})", len(long))):
                key = name.split()[0]
                cpu = med(key, "cpu_per_1000")
                limit = 1000 / cpu
                print(
                    f"{name:16}{n:>9}{med(key, 'tokens_per_req'):>9.0f}{med(key, 'rps'):>9.0f}{med(key, 'tps'):>11.0f}{cpu:>16.3f}{limit:>20.0f}"
                    + "".join(f"{limit / r:>13.0f}x" for r in rates)
                )
            # Client CPU grows with the answer's length: a line through the two shapes, extrapolated.
            per_tok = (med("long", "cpu_per_1000") - med("short", "cpu_per_1000")) / (
                med("long", "tokens_per_req") - med("short", "tokens_per_req")
            )
            base = med("short", "cpu_per_1000") - per_tok * med("short", "tokens_per_req")
            for tokens in (16384, 32768):
                cpu = base + per_tok * tokens
                print(
                    f"{f'~{tokens} (extrap.)':16}{'':>9}{tokens:>9}{'':>9}{'':>11}{cpu:>16.3f}{1000 / cpu:>20.0f}"
                    + "".join(f"{1000 / cpu / r:>13.1f}x" for r in rates)
                )
            print(
                f"client CPU: {base:.3f} ms per request + {per_tok * 1000:.3f} ms per 1,000 output tokens (one core: at most {1 / per_tok / 1000:.2f} M output tok/s);"
                " '1-core limit' = 1000 / (CPU s per 1,000 requests)"
            )
            figures["throughput"] = {
                **{name: medians(r) for name, r in runs.items()},
                "cpu_ms_per_request": round(base, 4),
                "cpu_ms_per_1k_output_tokens": round(per_tok * 1000, 4),
            }
            print()
        if args.part in ("b", "both", "all"):
            rates = [float(x) for x in args.server_rps.split(",")]
            variants = [
                ("short", build_requests(tokenizer, args.occupancy_requests, 256), short_template, c),
                (
                    "long",
                    build_requests(tokenizer, args.occupancy_long_requests, args.long_tokens),
                    long_template,
                    args.long_concurrency,
                ),
            ]
            port = free_port()
            occ: dict[str, list[dict]] = {name: [] for name, *_ in variants}
            breakdown = {}
            with engine(tok_dir, port, tmp, args.latency_ms) as url:
                throughput_run(url, short_template, variants[0][1][:200], tmp, c)  # warm-up
                for _ in range(args.repeats):
                    for name, reqs, template, conc in variants:
                        occ[name].append(occupancy_run(url, template, reqs, tmp, conc))
                for name, reqs, template, _conc in variants:
                    breakdown[name] = cpu_breakdown(
                        url, GenerateClient([url], template, ClientSettings.from_config()), reqs[0], tmp
                    )
            print(
                f"(b) occupancy, added latency {args.latency_ms} ms (uniform), median of {args.repeats}; the window is the time while requests remain queued"
            )
            print(
                f"{'answers':16}{'conc.':>6}{'requests':>9}{'window s':>9}{'req/s':>7}{'client CPU':>11}  {'view':31}{'share at c':>11}{'mean/c':>9}{'gap ms/req':>11}"
                + "".join(f"{f'at {r:g} req/s':>13}" for r in rates)
            )
            for name, reqs, _template, conc in variants:
                med = lambda k, name=name: statistics.median(r[k] for r in occ[name])  # noqa: E731
                label = "short (<=256)" if name == "short" else f"long ({args.long_tokens})"
                head = f"{label:16}{conc:>6}{len(reqs):>9}{med('window_s'):>9.1f}{med('rps'):>7.0f}{med('cpu_share'):>11.0%}  "
                for view, key in (("client counter, time-weighted", "counter"), ("on the wire, time-weighted", "wire")):
                    gap = med(key + "_gap_ms")
                    print(
                        f"{head}{view:31}{med(key):>11.2%}{med(key + '_mean'):>9.3%}{gap:>11.3f}"
                        + "".join(f"{max(0.0, 1 - r * gap / 1000):>13.2%}" for r in rates)
                    )
                    head = " " * len(head)
                print(
                    f"{head}{'client counter, sampled 5 ms':31}{med('sampled'):>11.2%}   ({med('samples'):.0f} samples, median {med('late_ms'):.1f} ms late)"
                )
                print(
                    f"{head}journal: {med('journal_ms'):.3f} ms per append on average; {med('syncs'):.0f} fsyncs of {med('fsync_ms'):.2f} ms, run in a thread, off the event loop"
                )
            print(
                "goal: share at c >= 99 %. 'at R req/s' = 1 - R x gap: the share expected when a server finishes R requests/s"
            )
            print()
            figures["occupancy"] = {name: medians(r) for name, r in occ.items()}
            print("client CPU per request, by step (one real answer, median of 200 runs, ms):")
            names = [k for k in breakdown["short"] if k not in ("n_output", "answer_kb")]
            print(f"{'answers':16}{'out tok':>8}{'answer KiB':>11}" + "".join(f"{n:>28}" for n in names))
            for name, b in breakdown.items():
                label = "short (<=256)" if name == "short" else f"long ({args.long_tokens})"
                print(f"{label:16}{b['n_output']:>8}{b['answer_kb']:>11.1f}" + "".join(f"{b[n]:>28.3f}" for n in names))
            print()
        if args.part in ("c", "all"):
            from eagle3_datagen.generation.planning import make_builder
            from eagle3_datagen.settings import ModelProfile, defaults

            model = defaults(
                "model",
                name="qwen3-bench",
                tokenizer=str(tok_dir),
                context_length=32768,
                stop_tokens=["<|im_end|>"],
                reasoning_end="</think>",
                reasoning_parser="qwen3",
                tool_call_parser="qwen25",
            )
            profile = ModelProfile.from_config(model)
            facts = {
                "tokenizer_sha256": "",
                "chat_template_sha256": "",
                "vocab_size": len(tokenizer),
                "stop_token_ids": stop,
            }
            budget = {"max_new_tokens": 256, "min_new_tokens": 4, "reserve_tokens": 2}
            builder = make_builder(facts, profile, SAMPLING, {"kind": "external"}, budget)
            rows = conversation_rows(tokenizer, profile, args.conversations, args.turns, 256)
            port = free_port()
            runs: dict[str, list[dict]] = {"multi": [], "single": []}
            with engine(tok_dir, port, tmp, args.latency_ms) as url:
                multi_turn_run(url, builder, rows[: 2 * c], tmp, c)  # warm-up (and the tokenizer loads)
                for _ in range(args.repeats):
                    runs["multi"].append(multi_turn_run(url, builder, rows, tmp, c))
                    # The baseline: as many single-turn requests, no follow-ups, the same client.
                    single = conversation_rows(tokenizer, profile, runs["multi"][-1]["requests"], 1, 256)
                    runs["single"].append(multi_turn_run(url, builder, single, tmp, c))
            rates = [float(x) for x in args.server_rps.split(",")]
            print(
                f"(c) multi-turn occupancy, {args.conversations} conversations x {args.turns} turns, added latency {args.latency_ms} ms, "
                f"concurrency {c}, median of {args.repeats}; the window lasts until the last new conversation is started; "
                "baseline: as many single-turn requests, no follow-ups"
            )
            print(
                f"{'run':12}{'requests':>9}{'turns/conv':>11}{'window s':>9}{'tail s':>8}{'req/s':>7}{'client CPU':>11}{'next turn ms':>13}  {'view':31}{'share at c':>11}{'mean/c':>9}{'gap ms/req':>11}"
                + "".join(f"{f'at {r:g} req/s':>13}" for r in rates)
            )
            for name in ("multi", "single"):
                med = lambda k, name=name: statistics.median(r[k] for r in runs[name])  # noqa: E731
                label = f"{args.turns} turns" if name == "multi" else "single-turn"
                head = f"{label:12}{med('requests'):>9.0f}{med('turns_per_conv'):>11.2f}{med('window_s'):>9.1f}{med('tail_s'):>8.1f}{med('rps'):>7.0f}{med('cpu_share'):>11.0%}{med('follow_ms'):>13.2f}  "
                for view, key in (("client counter, time-weighted", "counter"), ("on the wire, time-weighted", "wire")):
                    gap = med(key + "_gap_ms")
                    print(
                        f"{head}{view:31}{med(key):>11.2%}{med(key + '_mean'):>9.3%}{gap:>11.3f}"
                        + "".join(f"{max(0.0, 1 - r * gap / 1000):>13.2%}" for r in rates)
                    )
                    head = " " * len(head)
            for key in ("counter", "wire"):
                ratio = statistics.median(r[key + "_gap_ms"] for r in runs["multi"]) / max(
                    statistics.median(r[key + "_gap_ms"] for r in runs["single"]), 1e-9
                )
                print(f"gap per request, {key}: multi-turn / single-turn = {ratio:.2f}x")
                runs[f"{key}_gap_multi_over_single"] = round(ratio, 4)
            print(
                "goal: share at c >= 99 % while work remains; 'next turn ms': the follow-up's CPU (decode, parse, render, "
                "tokenize) per answer; 'at R req/s' = 1 - R x gap"
            )
            figures["multi_turn"] = {k: medians(v) if isinstance(v, list) else v for k, v in runs.items()}
    write_figures(args, figures)


if __name__ == "__main__":
    main()
