"""tokenize_prompts at scale: time and peak memory of the whole step on 2,500 to 20,000 multi-turn
conversations of a few thousand tokens each, and how they grow with the rows.

The conversations are ShareGPT-shaped (`conversations` with `from`/`value`, 1 to 6 human turns with
gpt answers between them, about 2,000-4,000 Qwen3 tokens each), made from the demo prompts' texts,
in one JSONL file per size. Each size runs the rule's own step function (`tokenize_prompts`, the
default batching) in a fresh process, so its peak RSS (VmHWM) is its own; `turns: last` tokenizes
every conversation whole (the heavier case), `turns: all` only the first turn's history (the later
turns are tokenized by the generate job, one at a time). Baselines from the same run, on the same
files: reading and parsing the JSONL (orjson, the reader's own parser), and the floor of rendering
plus `encode_batch` of every whole conversation.

    .venv/bin/python bench/tokenize_scale.py [--sizes 2500,5000,10000,20000]
"""

import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1] + "/scripts")
from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir
from eagle3_datagen.settings import defaults
from eagle3_datagen.storage.tables import count_rows
from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts
source, out, turns = sys.argv[2], sys.argv[3], sys.argv[4]
model = defaults("model", name="qwen3", tokenizer=str(qwen3_tokenizer_dir()), context_length=131072,
                 stop_tokens=["<|im_end|>"], reasoning_end="</think>", reasoning_parser="qwen3",
                 tool_call_parser="qwen25")
t = time.perf_counter()
tokenize_prompts(source=source, prompts=out, category="big", model=model,
                 budget={"max_new_tokens": 4096, "min_new_tokens": 16, "reserve_tokens": 2},
                 samples_per_prompt=1, seed=1, on_bad_rows="quarantine", turns=turns)
wall = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024
print(json.dumps({"wall_s": wall, "peak_mb": hwm, "rows": count_rows(out)}))
"""

FLOOR = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1] + "/scripts")
from transformers import AutoTokenizer
from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir
from eagle3_datagen.storage.prompts import iter_prompts
tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
rows = [r.messages for r in iter_prompts(sys.argv[2]) if r.ok]
t = time.perf_counter()
n = 0
for i in range(0, len(rows), 1024):
    texts = tok.apply_chat_template(rows[i : i + 1024], add_generation_prompt=True, tokenize=False)
    n += sum(len(e.ids) for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False))
print(json.dumps({"wall_s": time.perf_counter() - t, "tokens": n}))
"""


def texts() -> list[str]:
    out = []
    for path in sorted((ROOT / "config" / "prompts").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            for m in row.get("messages") or row.get("conversations") or []:
                text = m.get("content") or m.get("value") or ""
                if len(text) > 40:
                    out.append(text)
    return out


def write_conversations(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    pool = texts()
    with open(path, "w") as fh:
        for i in range(n):
            turns = rng.randint(1, 6)
            per_turn = rng.randint(2000, 4000) * 4 // (2 * turns)  # characters per message, ~4 per token
            conv = []
            for k in range(turns):
                for speaker in ("human", "gpt") if k < turns - 1 else ("human",):
                    parts, size = [f"{speaker} {i}.{k}:"], 0
                    while size < per_turn:
                        parts.append(rng.choice(pool))
                        size += len(parts[-1])
                    conv.append({"from": speaker, "value": " ".join(parts)})
            fh.write(json.dumps({"id": f"c{i}", "conversations": conv}) + "\n")


def run(code: str, *args) -> dict:
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import orjson

    parser = BenchParser(__doc__, smoke={"sizes": "20,40"})
    parser.add_argument("--sizes", default="2500,5000,10000,20000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs, floor_figures = [], None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        print(
            f"{'rows':>7}{'turns':>6}{'wall s':>9}{'rows/s':>9}{'s per 1k rows':>15}{'peak RSS MB':>13}{'vs parse':>10}{'vs floor':>10}"
        )
        for n in sizes:
            source = tmp / f"c{n}.jsonl"
            write_conversations(source, n)
            t = time.perf_counter()
            with open(source, "rb") as fh:
                for line in fh:
                    orjson.loads(line)
            parse_s = time.perf_counter() - t
            floor = run(FLOOR, source) if n == sizes[-1] else None
            modes = ("last", "all") if n == sizes[-1] else ("last",)
            for turns in modes:
                r = run(CHILD, source, tmp / f"p{n}-{turns}.parquet", turns)
                vs_floor = f"{r['wall_s'] / floor['wall_s']:>9.2f}x" if floor and turns == "last" else f"{'':>10}"
                print(
                    f"{n:>7}{turns:>6}{r['wall_s']:>9.1f}{n / r['wall_s']:>9.0f}{r['wall_s'] / n * 1000:>15.2f}"
                    f"{r['peak_mb']:>13.0f}{r['wall_s'] / parse_s:>9.1f}x{vs_floor}"
                )
                runs.append({"rows": n, "turns": turns, **r, "parse_s": round(parse_s, 3)})
            if floor:
                print(
                    f"floor at {n} rows: {floor['wall_s']:.1f} s for {floor['tokens'] / 1e6:.1f} M prompt tokens "
                    f"({floor['tokens'] / n:.0f} per conversation); JSONL parse: {parse_s:.1f} s "
                    f"({source.stat().st_size / 1e6:.0f} MB)"
                )
                floor_figures = {"rows": n, **floor}
    write_figures(args, {"runs": runs, "floor": floor_figures})


if __name__ == "__main__":
    main()
