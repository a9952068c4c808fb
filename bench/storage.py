"""Bytes per token of the generations store (Parquet, zstd) against JSONL of the same rows.

Synthetic generation rows with realistic ids: the text is the standard library's sources (prose of
docstrings and comments, and code), tokenized with the Qwen3 tokenizer. Each row has a prompt of
about --prompt-tokens tokens (a user message rendered by ChatTokenizer with the Qwen3 chat template)
and an output of 1k-4k tokens shaped like a reasoning model's (`<think> reasoning </think> answer
<|im_end|>`), with the other columns of GENERATIONS_SCHEMA filled as the generate rule fills them.
All files are written in the same run, from the same rows:

  generations Parquet   tables.write_table(rows, GENERATIONS_SCHEMA): what results/generations holds
  generations JSONL     the same rows, one compact JSON object a line
  dataset JSONL         the exported shape {"input_ids", "loss_mask", ...} (export.dataset_row and
                        export's JsonlWriter: what results/dataset/*.jsonl holds)
  dataset Parquet       the same dataset rows with export.DATASET_SCHEMA

Tokens are prompt + output tokens of every row; each figure is also given relative to the
generations Parquet.

    .venv/bin/python bench/storage.py [--rows 2000] [--prompt-tokens 300] [--repeats 3] [--smoke]
        [--figures FILE]
"""

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures
from check_parsers import real_text  # bench/check_parsers.py: imported before scripts/ (its rule script) is on the path

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.settings import DEFAULT_MODE, ModelProfile  # noqa: E402
from eagle3_datagen.steps.export_dataset import DATASET_SCHEMA, JsonlWriter  # noqa: E402
from eagle3_datagen.storage.tables import GENERATIONS_SCHEMA, write_table  # noqa: E402
from eagle3_datagen.storage.trainer_rows import dataset_row  # noqa: E402
from eagle3_datagen.tokens.templating import ChatTokenizer  # noqa: E402


def write_jsonl(rows, path) -> None:
    """Rows as export_dataset writes results/dataset/*.jsonl."""
    with JsonlWriter(path) as writer:
        writer.write(rows)


def synthesize(tok, n_rows: int, prompt_tokens: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    stream = tok.backend_tokenizer.encode(real_text(4_000_000), add_special_tokens=False).ids
    tid = tok.convert_tokens_to_ids
    think, end, stop = tid("<think>"), tid("</think>"), tid("<|im_end|>")
    newlines = tok.backend_tokenizer.encode("\n\n", add_special_tokens=False).ids
    profile = ModelProfile(
        name="qwen3", tokenizer="", context_length=40960, chat_template_kwargs={"enable_thinking": True}
    )
    starts = [rng.randrange(len(stream) - prompt_tokens) for _ in range(n_rows)]
    questions = [tok.decode(stream[s : s + prompt_tokens - 20]) for s in starts]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    prompts = ChatTokenizer(tok, profile).tokenize(conversations, [None] * n_rows)
    sampling = json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0}, sort_keys=True
    )
    rows = []
    for i in range(n_rows):
        n_out = rng.randint(1000, 4000)
        s = rng.randrange(len(stream) - n_out)
        body = stream[s : s + n_out - 4]
        cut = int(len(body) * rng.uniform(0.5, 0.85))
        output = [think] + body[:cut] + [end] + newlines + body[cut:] + [stop]
        rows.append(
            {
                "id": f"chat-{i:06d}",
                "sample_index": 0,
                "turn": 0,
                "mode": DEFAULT_MODE,
                "category": "chat",
                "messages": json.dumps(conversations[i]),
                "tools": "",
                "prompt_ids": prompts[i].prompt_ids,
                "output_ids": output,
                "finish_type": "stop",
                "finish_matched": str(stop),
                "completion_tokens": len(output),
                "cached_tokens": rng.choice((0, 0, 16, 32)),
                "e2e_latency": rng.uniform(30.0, 900.0),
                "num_retractions": 0,
                "queue_time": rng.uniform(0.0, 2.0),
                "sampling": sampling,
                "seed": rng.randrange(2**31 - 1),
                "max_new_tokens": 32768,
                "attempts": 1,
                "status": "ok",
                "error": "",
            }
        )
    return rows


def main() -> int:
    ap = BenchParser(__doc__, smoke={"rows": 20, "repeats": 1})
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="timed writes per format (sizes do not vary)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    rows = synthesize(tok, args.rows, args.prompt_tokens)
    dataset = [dataset_row(r) for r in rows]
    n_prompt = sum(len(r["prompt_ids"]) for r in rows)
    n_output = sum(len(r["output_ids"]) for r in rows)
    tokens = n_prompt + n_output
    writers = {
        "generations Parquet (zstd)": ("g.parquet", lambda p: write_table(rows, GENERATIONS_SCHEMA, p)),
        "generations JSONL": ("g.jsonl", lambda p: write_jsonl(rows, p)),
        "dataset JSONL (export)": ("d.jsonl", lambda p: write_jsonl(dataset, p)),
        "dataset Parquet (zstd)": ("d.parquet", lambda p: write_table(dataset, DATASET_SCHEMA, p)),
    }
    sizes, seconds = {}, {name: [] for name in writers}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, (file_name, write) in writers.items():
                path = Path(tmp) / file_name
                t0 = time.perf_counter()
                write(path)
                seconds[name].append(time.perf_counter() - t0)
                sizes[name] = path.stat().st_size
    base = sizes["generations Parquet (zstd)"]
    print(
        f"{len(rows)} rows: {n_prompt / len(rows):.0f} prompt + {n_output / len(rows):.0f} output tokens per row on average, {tokens / 1e6:.2f} M tokens"
    )
    print(f"{'store':28}{'MiB':>9}{'bytes/token':>13}{'vs Parquet':>12}{'write s':>9}")
    for name in writers:
        print(
            f"{name:28}{sizes[name] / 2**20:>9.1f}{sizes[name] / tokens:>13.2f}{sizes[name] / base:>11.2f}x{statistics.median(seconds[name]):>9.2f}"
        )
    print(f"raw int32 ids for reference: 4.00 bytes/token; write s: median of {args.repeats}")
    stores = {
        name: {
            "bytes": sizes[name],
            "bytes_per_token": round(sizes[name] / tokens, 3),
            "over_generations_parquet": round(sizes[name] / base, 3),
            "write_s": round(statistics.median(seconds[name]), 3),
        }
        for name in writers
    }
    write_figures(args, {"rows": len(rows), "tokens": tokens, "stores": stores})
    return 0


if __name__ == "__main__":
    sys.exit(main())
