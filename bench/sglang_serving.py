"""The generate client beside SGLang's own benchmark, on one real SGLang server.

Does the pipeline get from a real SGLang server what SGLang's benchmark (`python -m
sglang.bench_serving`, the one that ships with the server) gets from it, and does `concurrency:
auto` find the best fixed concurrency of that server?

One real SGLang 0.5.23 server on CPU (tests/sglang_server.py's install and flags; the demo's tiny
model, 2 layers, hidden 64, on the Kimi-shaped tokenizer) serves every run of one invocation. The
prompts are MT-Bench's first questions (`make realdata`), rendered by the model's chat template into
`prompt_ids`; the client sends those ids, bench_serving the same prompts as text (the decoded ids,
which the server tokenizes back to the same ids: the input tokens of both are printed), so both send
the same prompts. Every answer is exactly --output-tokens tokens (ignore_eos; bench_serving's
default). Runs: bench_serving at each --sweep value of --max-concurrency (request rate inf), the
client at each fixed concurrency of the sweep and at `auto`, in an order shuffled with a fixed seed,
the server's prefix cache flushed before each. Each run's figure is its output tokens over its wall
time (bench_serving's `output_throughput`: the same definition), median of --repeats.

Figures: the client's best (auto, and the best fixed value) over bench_serving's best; auto over the
client's best fixed value. Goals: both ≥ 0.95.

    .venv/bin/python bench/sglang_serving.py [--requests 256] [--output-tokens 128] [--sweep 8,16,32,64]
        [--repeats 2] [--out /tmp/sglang_serving.json]
"""

import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _harness import ROOT, BenchParser, require, write_figures

sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import sglang_server  # noqa: E402
from eagle3_datagen.demo import model as demo_model  # noqa: E402
from eagle3_datagen.generation.client import GenerateClient  # noqa: E402
from eagle3_datagen.generation.journal import Journal  # noqa: E402
from eagle3_datagen.generation.requests import Request, RequestTemplate  # noqa: E402
from eagle3_datagen.settings import ClientSettings  # noqa: E402
from real_sglang import real_server  # noqa: E402
from tokenization import fixture_path  # noqa: E402

SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
AUTO = "auto"


def prompts(tokenizer, n: int) -> list[list[int]]:
    """The first `n` MT-Bench first questions (repeated past its 80, each then marked apart), rendered."""
    source = require(ROOT / ".cache" / "realdata" / "mtbench.jsonl", "the real MT-Bench questions", "realdata")
    questions = [json.loads(line)["messages"][0]["content"] for line in source.read_text().splitlines()]
    out = []
    for i in range(n):
        text = questions[i % len(questions)] + (f" ({i // len(questions)})" if i >= len(questions) else "")
        messages = [{"role": "user", "content": text}]
        out.append(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    return out


def flush_cache(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/flush_cache", method="POST"), timeout=60):
        pass


def client_run(url: str, template: RequestTemplate, ids: list[list[int]], tokens: int, concurrency, tmp: Path):
    settings = {"concurrency": concurrency, "progress_interval_s": 3600}
    client = GenerateClient([url], template, ClientSettings.from_config(**settings))
    reqs = [Request(f"p{i}", 0, p, tokens, seed=i, fingerprint=str(i)) for i, p in enumerate(ids)]
    journal = Journal(tmp / f"journal-{time.monotonic_ns()}.jsonl")
    started = time.monotonic()
    results = asyncio.run(client.run(reqs, journal))
    wall = time.monotonic() - started
    journal.close()
    assert all(r["status"] == "ok" for r in results.values()), "a request failed"
    output = sum(len(r["output_ids"]) for r in results.values())
    assert output == tokens * len(ids), f"{output} output tokens, not {tokens} per request"
    return {"tps": output / wall, "wall_s": wall, "output_tokens": output, "input_tokens": sum(map(len, ids))}


def bench_serving_run(url: str, model_dir: Path, dataset: Path, n: int, tokens: int, concurrency: int, tmp: Path):
    out = tmp / f"bench-{time.monotonic_ns()}.jsonl"
    cmd = [
        str(sglang_server.installed()), "-m", "sglang.bench_serving",
        "--backend", "sglang", "--base-url", url, "--tokenizer", str(model_dir), "--model", str(model_dir),
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(n),
        "--sharegpt-output-len", str(tokens), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--temperature", str(SAMPLING["temperature"]), "--seed", "1", "--disable-tqdm", "--output-file", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"bench_serving exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["completed"] == n, f"bench_serving completed {result['completed']} of {n}"
    return {
        "tps": result["output_throughput"],
        "wall_s": result["duration"],
        "output_tokens": result["total_output_tokens"],
        "input_tokens": result["total_input_tokens"],
    }


def label(kind: str, c) -> str:
    return f"{kind}@{c}"


def main() -> None:
    parser = BenchParser(
        __doc__, smoke={"requests": 6, "output_tokens": 8, "sweep": "2", "repeats": 1, "out": "/tmp/sglang-smoke.json"}
    )
    parser.add_argument("--requests", type=int, default=256, help="requests per run")
    parser.add_argument("--output-tokens", type=int, default=128, help="tokens of every answer (ignore_eos)")
    parser.add_argument("--sweep", default="8,16,32,64", help="fixed concurrencies, both sides")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order")
    parser.add_argument("--out", default="/tmp/sglang_serving.json", help="raw results, JSON")
    args = parser.parse_args()
    require(sglang_server.python(), f"the real SGLang {sglang_server.VERSION} server", "sglang-server")
    from transformers import AutoTokenizer

    model_dir = fixture_path("demo_model", demo_model.build_demo_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = prompts(tokenizer, args.requests)
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    template = RequestTemplate({**SAMPLING, "ignore_eos": True}, stop, len(tokenizer))
    sweep = [int(x) for x in args.sweep.split(",")]
    runs: dict[str, list[dict]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "prompts.jsonl"
        rows = [{"conversations": [{"value": tokenizer.decode(p)}, {"value": "-"}]} for p in ids]
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        context = max(map(len, ids)) + args.output_tokens + 16
        budget = max(8192, 2 * context * max(sweep))
        with real_server(model_dir, tmp / "server.log", context_length=context, max_total_tokens=budget) as url:
            client_run(url, template, ids[:2], 4, 2, tmp)  # warm-up: the server's first batches, connections
            for rep in range(args.repeats):
                order = [("client", c) for c in [*sweep, AUTO]] + [("bench_serving", c) for c in sweep]
                random.Random(f"{args.seed}-{rep}").shuffle(order)
                for kind, c in order:
                    flush_cache(url)
                    if kind == "client":
                        run = client_run(url, template, ids, args.output_tokens, c, tmp)
                    else:
                        run = bench_serving_run(url, model_dir, dataset, len(ids), args.output_tokens, c, tmp)
                    runs.setdefault(label(kind, c), []).append(run)
                    print(f"  repeat {rep + 1} {label(kind, c):>18}: {run['tps']:7.1f} tok/s", file=sys.stderr)
    total = time.monotonic() - started
    tps = {name: statistics.median(r["tps"] for r in rs) for name, rs in runs.items()}
    bench_best = max(sweep, key=lambda c: tps[label("bench_serving", c)])
    client_best = max(sweep, key=lambda c: tps[label("client", c)])
    best = tps[label("bench_serving", bench_best)]
    figures = {
        "requests": args.requests,
        "output_tokens": args.output_tokens,
        "repeats": args.repeats,
        "tps": {name: round(v, 2) for name, v in tps.items()},
        "input_tokens": {
            "client": runs[label("client", AUTO)][0]["input_tokens"],
            "bench_serving": runs[label("bench_serving", bench_best)][0]["input_tokens"],
        },
        "bench_serving_best": bench_best,
        "client_best": client_best,
        "auto_over_bench_serving_best": round(tps[label("client", AUTO)] / best, 3),
        "client_best_over_bench_serving_best": round(tps[label("client", client_best)] / best, 3),
        "auto_over_client_best": round(tps[label("client", AUTO)] / tps[label("client", client_best)], 3),
        "total_s": round(total, 1),
    }
    lines = ["| concurrency | bench_serving tok/s | client tok/s | client ÷ bench_serving |", "|---:|---:|---:|---:|"]
    for c in sweep:
        b, p = tps[label("bench_serving", c)], tps[label("client", c)]
        lines.append(f"| {c} | {b:,.1f} | {p:,.1f} | {p / b:.3f} |")
    lines.append(f"| auto | | {tps[label('client', AUTO)]:,.1f} | |")
    print("\n".join(lines))
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs, "figures": figures}, indent=1, default=str))
    write_figures(args, figures)


if __name__ == "__main__":
    main()
