"""The seeds' scale on one host: a synthetic category through the whole DAG, per rule wall time,
rows/s and peak RSS, against pyarrow reading and writing the same Parquet files in the same run.

One category of `--rows` short prompts (the real Qwen3 tokenizer) is answered by the scripted
engine with long answers (`--answer-tokens LO:HI` reasoning tokens per request, uniform; 15% of the
answers ramble to the budget and end truncated, as thinking models' do), and runs through every
rule with `snakemake --cores 2`. Snakemake's `benchmark:` files give each job's wall time and
`max_rss` (the job's process tree: the generate job's includes its engine). The baselines, measured
on the same files after the run, each in a fresh process:

- `stream copy`: `pq.ParquetFile.iter_batches` into a `pq.ParquetWriter` (the same zstd and row
  groups of 1024 rows): what any streaming step pays just to read and write the table;
- `whole copy`: `pq.read_table` + `pq.write_table`: what holding the table in memory costs;
- `cat`: copying the dataset JSONL byte for byte (merge_dataset's floor).

With `--small N` a first run of N rows gives each rule's rows/s at two sizes (time that grows
linearly keeps the ratio near 1). The projection scales the measured per-token cost to the seeds'
run (`--project-rows` prompts, `--project-tokens` answer tokens each); memory is bounded by the
batch (config `batch`), so it is projected as measured.

    .venv/bin/python bench/scale.py [--rows 100000] [--small 2000] [--answer-tokens 1000:16000]
                                    [--dir /tmp/eagle3-scale] [--out bench/scale.json]

The real-data run takes a real prompt file instead of synthetic rows: ShareGPT's 17,671
conversations (`python tests/realdata.py` writes them), every turn regenerated on the model's own
answers (`turns: all`), with their real lengths, languages and quirks:

    .venv/bin/python bench/scale.py --real .cache/realdata/sharegpt.json --answer-tokens 200:2000 \
        --max-new-tokens 4096 --out bench/scale_real.json
"""

import csv
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _harness import ROOT, BenchParser, require, write_figures

sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests" / "integration")]

from workdir import Workdir  # noqa: E402

from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.runner import logged_peak_rss  # noqa: E402

# Rules in DAG order, their job's name in benchmarks/ and logs/, and the baseline each is set against:
# the plain copy of the table it reads.
RULES = [
    ("tokenize_prompts", "tokenize_prompts/scale", "prompts: stream copy"),
    ("plan_generation", "plan_generation/scale/shard_0", "prompts: stream copy"),
    ("generate", "generate/scale/shard_0", "generations: stream copy"),
    ("merge_shards", "merge_shards/scale", "generations: stream copy"),
    ("check_sequences", "check_sequences/scale", "generations: stream copy"),
    ("check_parsers", "check_parsers/scale", "generations: stream copy"),
    ("export_dataset", "export_dataset/scale", "generations: stream copy"),
    ("merge_dataset", "merge_dataset", "dataset jsonl: cat"),
    ("summarize", "summarize", "generations: stream copy"),
    ("plot_checks", "plot_checks", "generations: stream copy"),
]
LOCAL = {name for name, _, _ in RULES} - {"generate"}

TOPICS = ("the integral", "a binary tree", "the French revolution", "a SQL join", "photosynthesis", "a sonnet")


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """Short, varied user prompts (10 to 200 words), some with a system prompt, ids stable."""
    rng = random.Random(seed)
    words = "please explain carefully with examples and check each step of the reasoning twice".split()
    rows = []
    for i in range(n):
        text = f"Question {i} about {rng.choice(TOPICS)}: " + " ".join(rng.choices(words, k=rng.randint(10, 200)))
        messages = [{"role": "user", "content": text}]
        if i % 4 == 0:
            messages.insert(0, {"role": "system", "content": "You are a careful assistant."})
        rows.append({"id": f"s-{i:06d}", "messages": messages})
    return rows


def run_dag(path: Path, rows: int | Path, answer_tokens: str, max_new_tokens: int) -> dict:
    """The whole DAG on `rows` synthetic rows, or on a real prompt file (every turn regenerated)."""
    if path.exists():
        shutil.rmtree(path)
    real = rows if isinstance(rows, Path) else None
    wd = Workdir(
        path,
        tokenizer=qwen3_tokenizer_dir(),
        model_dir=None,
        backend="scripted",
        categories={"scale": [] if real else synthetic_rows(rows)},
        plain_qwen3=True,
        engine_args=f"--answer-tokens {answer_tokens}",
    )
    if real:
        target = path / "config" / "prompts" / f"scale{real.suffix}"
        shutil.copyfile(real, target)
        (path / "config" / "categories.tsv").write_text(f"category\tprompts\nscale\tconfig/prompts/{target.name}\n")
        wd.config["turns"] = "all"
    wd.config["max_new_tokens"] = max_new_tokens
    wd.config["model"]["context_length"] = 32768
    wd.config["engine"]["startup_timeout_s"] = 600
    wd.config["client"]["progress_interval_s"] = 30
    wd.write_config()
    started = time.perf_counter()
    wd.snakemake("--cores", "2", timeout=6 * 3600)
    total = time.perf_counter() - started
    shutil.rmtree(wd.record_dir, ignore_errors=True)  # the engine's record of every answer: not the pipeline's
    jobs = {}
    for name, job, _ in RULES:
        with open(path / "benchmarks" / f"{job}.tsv") as fh:
            row = next(csv.DictReader(fh, delimiter="\t"))
        # The step's own peak (getrusage, exact) from its log; Snakemake samples max_rss (every 30 s
        # after the first 30) over the job's process tree.
        own, child = logged_peak_rss((path / "logs" / f"{job}.log").read_text())
        jobs[name] = {
            "s": float(row["s"]),
            "peak_rss_mb": own,
            "child_peak_rss_mb": child,
            "snakemake_max_rss_mb": float(row["max_rss"]) if row["max_rss"] != "NA" else None,
        }
    found = sizes(path)
    return {"path": str(path), "source": str(real or "synthetic"), "total_s": round(total, 1), "jobs": jobs, **found}


def sizes(path: Path) -> dict:
    """Tokens and bytes of the run, from its files."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    gens = path / "results" / "generations" / "scale.parquet"
    table = pq.read_table(gens, columns=["prompt_ids", "output_ids", "status"])
    prompt_tokens = int(pc.sum(pc.list_value_length(table["prompt_ids"])).as_py() or 0)
    output_tokens = int(pc.sum(pc.list_value_length(table["output_ids"])).as_py() or 0)
    train = path / "results" / "train" / "train.jsonl"
    with open(train, "rb") as fh:
        train_rows = sum(1 for _ in fh)
    prompts = pq.read_table(path / "results" / "prompts" / "scale.parquet", columns=["status"])
    return {
        "rows": table.num_rows,  # generations rows: one per turn
        "conversations": prompts.num_rows,
        "statuses": {d["values"]: d["counts"] for d in pc.value_counts(table["status"]).to_pylist()},
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "train_rows": train_rows,
        "bytes": {
            "results": du(path / "results"),
            "cache": du(path / "cache"),
            "generations.parquet": gens.stat().st_size,
            "dataset jsonl": (path / "results" / "dataset" / "scale.jsonl").stat().st_size,
            "train.jsonl": train.stat().st_size,
        },
    }


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


BASELINE = r"""
import shutil, sys, time
import pyarrow.parquet as pq
kind, src, dst = sys.argv[1:]
t = time.perf_counter()
if kind == "stream copy":
    pf = pq.ParquetFile(src)
    with pq.ParquetWriter(dst, pf.schema_arrow, compression="zstd") as w:
        for batch in pf.iter_batches(batch_size=1024):
            w.write_batch(batch)
elif kind == "whole copy":
    pq.write_table(pq.read_table(src), dst, compression="zstd")
else:
    shutil.copyfile(src, dst)
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(time.perf_counter() - t, int(hwm.split()[1]) / 1024)
"""


def baselines(run: dict) -> dict:
    """Each baseline in a fresh interpreter, on the run's own files (wall s, peak RSS MB)."""
    path = Path(run["path"])
    files = {
        "prompts": path / "results" / "prompts" / "scale.parquet",
        "generations": path / "results" / "generations" / "scale.parquet",
        "dataset jsonl": path / "results" / "dataset" / "scale.jsonl",
    }
    out = {}
    for table, src in files.items():
        kinds = ("cat",) if table == "dataset jsonl" else ("stream copy", "whole copy")
        for kind in kinds:
            dst = path / f"baseline.{kind.replace(' ', '_')}{src.suffix}"
            done = subprocess.run(
                [sys.executable, "-c", BASELINE, kind, str(src), str(dst)], capture_output=True, text=True, check=True
            )
            dst.unlink()
            seconds, rss = (float(x) for x in done.stdout.split())
            out[f"{table}: {kind}"] = {"s": round(seconds, 3), "max_rss_mb": round(rss, 1)}
    return out


def table(run: dict, base: dict, small: dict | None) -> str:
    lines = [
        "| rule | wall s | rows/s | peak RSS MB | Snakemake max_rss MB | wall / stream copy of its table |"
        + (f" rows/s at {small['rows']:,} rows | ratio |" if small else ""),
        "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if small else ""),
    ]
    rows = run["rows"]
    for name, _, key in RULES:
        job = run["jobs"][name]
        ratio = f"{job['s'] / max(base[key]['s'], 1e-3):.1f}"
        peak = f"{job['peak_rss_mb']:,.0f}" + (
            f" (engine {job['child_peak_rss_mb']:,.0f})" if job["child_peak_rss_mb"] else ""
        )
        sampled = f"{job['snakemake_max_rss_mb']:,.0f}" if job["snakemake_max_rss_mb"] is not None else "—"
        line = f"| {name} | {job['s']:.1f} | {rows / job['s']:,.0f} | {peak} | {sampled} | {ratio} |"
        if small:
            s_job = small["jobs"][name]
            small_rate = small["rows"] / s_job["s"]
            line += f" {small_rate:,.0f} | {(rows / job['s']) / small_rate:.2f} |"
        lines.append(line)
    lines.append("")
    lines.append("| baseline (same files, same run) | wall s | peak RSS MB |")
    lines.append("|---|---:|---:|")
    for name, b in base.items():
        lines.append(f"| {name} | {b['s']:.1f} | {b['max_rss_mb']:,.0f} |")
    return "\n".join(lines)


def projection(run: dict, project_rows: int, project_tokens: int) -> str:
    tokens = run["prompt_tokens"] + run["output_tokens"]
    target = project_rows * (project_tokens + run["prompt_tokens"] / run["rows"])
    scale = target / tokens
    local_s = sum(j["s"] for n, j in run["jobs"].items() if n in LOCAL)
    peak = max(j["peak_rss_mb"] for n, j in run["jobs"].items() if n in LOCAL)
    b = run["bytes"]
    return (
        f"Measured: {run['rows']:,} rows, {run['output_tokens'] / 1e6:,.0f} M output tokens "
        f"({run['output_tokens'] / run['rows']:,.0f} per row), {tokens / 1e6:,.0f} M tokens in all.\n"
        f"Projected for {project_rows:,} prompts x {project_tokens:,} answer tokens ({target / 1e6:,.0f} M tokens, "
        f"x{scale:.2f}): local rules {local_s * scale / 60:,.0f} min in all on this machine's 2 cores "
        f"(measured {local_s / 60:,.1f} min), peak RSS of any local rule {peak:,.0f} MB (bounded by the batch, "
        f"not the rows), disk: results {b['results'] * scale / 1e9:,.0f} GB "
        f"(train.jsonl {b['train.jsonl'] * scale / 1e9:,.0f} GB, category JSONL "
        f"{b['dataset jsonl'] * scale / 1e9:,.0f} GB, generations Parquet {b['generations.parquet'] * scale / 1e9:,.0f} GB), "
        f"cache (journal) {b['cache'] * scale / 1e9:,.0f} GB."
    )


def main() -> None:
    smoke = {"rows": 12, "small": 0, "answer_tokens": "50:200", "max_new_tokens": 512, "out": None}
    parser = BenchParser(__doc__, smoke={**smoke, "dir": Path("/tmp/eagle3-scale-smoke")})
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=2_000, help="rows of a first, small run (0: none)")
    parser.add_argument("--answer-tokens", default="1000:16000")
    parser.add_argument("--max-new-tokens", type=int, default=16384)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/eagle3-scale"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "scale.json", help="every figure, JSON")
    parser.add_argument("--keep", action="store_true", help="keep the working directories")
    parser.add_argument("--project-rows", type=int, default=88_000)
    parser.add_argument("--project-tokens", type=int, default=10_000)
    parser.add_argument(
        "--real",
        type=Path,
        help="a real prompt file (.cache/realdata/sharegpt.json: `python tests/realdata.py` writes it): the DAG "
        "runs on it, every turn regenerated, instead of on --rows synthetic rows (no --small run)",
    )
    args = parser.parse_args()
    if args.real:
        require(args.real, "the real prompt file", "realdata")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    results = {"args": {k: str(v) for k, v in vars(args).items()}}
    small = None
    if args.real:
        args.small = 0
    if args.small:
        small = run_dag(args.dir / f"rows{args.small}", args.small, args.answer_tokens, args.max_new_tokens)
        results["small"] = small
        print(json.dumps(small, indent=1), flush=True)
        if not args.keep:
            shutil.rmtree(small["path"])
    source = args.real.resolve() if args.real else args.rows
    name = f"real-{args.real.stem}" if args.real else f"rows{args.rows}"
    run = run_dag(args.dir / name, source, args.answer_tokens, args.max_new_tokens)
    results["run"] = run
    results["baselines"] = base = baselines(run)
    results["table"] = table(run, base, small)
    results["projection"] = projection(run, args.project_rows, args.project_tokens)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(results["table"])
    print()
    print(results["projection"])
    if not args.keep:
        shutil.rmtree(run["path"])
    jobs = {name: {"s": j["s"], "peak_rss_mb": j["peak_rss_mb"]} for name, j in run["jobs"].items()}
    figures = {k: run[k] for k in ("rows", "prompt_tokens", "output_tokens")}
    write_figures(args, {**figures, "jobs": jobs, "baselines": base, "small_rows": small["rows"] if small else None})


if __name__ == "__main__":
    main()
