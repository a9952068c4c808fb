"""Client throughput and CPU cost with the journal on and off, against the scripted engine on loopback.

The engine runs as its own process (python -m eagle3_datagen.engine --backend scripted), so the
client's CPU time is measured alone (time.process_time of this process). Runs alternate between
journal on and off, so both see the same machine state; the report gives each figure and the ratio.

    .venv/bin/python bench/client_journal.py [--requests 2000] [--repeats 3]
"""

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

from client_load import engine  # noqa: E402  (the same scripted engine as the load benchmark)
from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.generation.client import GenerateClient  # noqa: E402
from eagle3_datagen.generation.journal import Journal  # noqa: E402
from eagle3_datagen.generation.requests import Request, RequestTemplate  # noqa: E402
from eagle3_datagen.generation.servers import free_port  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402


def requests(tokenizer, n: int, max_new_tokens: int) -> list[Request]:
    out = []
    for i in range(n):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: explain item {i}."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        out.append(Request(f"b-{i}", 0, ids, max_new_tokens, seed=i, fingerprint=str(i)))
    return out


def run_once(
    url: str, template: RequestTemplate, reqs: list[Request], *, journal_dir: Path | None, concurrency: int
) -> dict:
    client = GenerateClient(
        [url], template, ClientSettings.from_config(concurrency=concurrency, progress_interval_s=3600)
    )
    journal = Journal(journal_dir / f"j{time.monotonic_ns()}.jsonl") if journal_dir else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = asyncio.run(client.run(reqs, journal))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if journal:
        journal.close()
    assert all(r["status"] == "ok" for r in results.values())
    tokens = sum(len(r["output_ids"]) for r in results.values())
    return {"rps": len(reqs) / wall, "tps": tokens / wall, "cpu_per_1000": cpu / len(reqs) * 1000}


def main() -> None:
    parser = BenchParser(__doc__, smoke={"requests": 20, "repeats": 1})
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok_dir = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    reqs = requests(tokenizer, args.requests, args.max_new_tokens)
    template = RequestTemplate(
        {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
        [tokenizer.convert_tokens_to_ids("<|im_end|>")],
        len(tokenizer),
    )
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, engine(tok_dir, port, Path(tmp), latency=None) as url:
        run_once(url, template, reqs[:200], journal_dir=None, concurrency=args.concurrency)  # warm-up
        on, off = [], []
        for _ in range(args.repeats):
            off.append(run_once(url, template, reqs, journal_dir=None, concurrency=args.concurrency))
            on.append(run_once(url, template, reqs, journal_dir=Path(tmp), concurrency=args.concurrency))
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    print(
        f"{args.requests} requests x {args.repeats} repeats, concurrency {args.concurrency}, up to {args.max_new_tokens} new tokens"
    )
    print(f"{'':14}{'req/s':>10}{'tok/s':>12}{'client CPU s / 1000 req':>26}")
    for name, runs in (("journal off", off), ("journal on", on)):
        print(f"{name:14}{med(runs, 'rps'):>10.0f}{med(runs, 'tps'):>12.0f}{med(runs, 'cpu_per_1000'):>26.3f}")
    print(
        f"ratio on/off  {med(on, 'rps') / med(off, 'rps'):>9.2f}x{med(on, 'tps') / med(off, 'tps'):>11.2f}x{med(on, 'cpu_per_1000') / med(off, 'cpu_per_1000'):>25.2f}x"
    )
    runs = {
        name: {k: round(med(r, k), 4) for k in ("rps", "tps", "cpu_per_1000")}
        for name, r in (("journal_off", off), ("journal_on", on))
    }
    ratio = round(runs["journal_on"]["cpu_per_1000"] / runs["journal_off"]["cpu_per_1000"], 3)
    write_figures(args, {"requests": args.requests, "repeats": args.repeats, **runs, "cpu_on_over_off": ratio})


if __name__ == "__main__":
    main()
