"""Workflow overhead: wall time of `snakemake -n` with many categories against one, in the same run.

Two fresh working directories are laid out as tests/integration/workdir.py does: config/config.yaml
(the demo config, categories: config/categories.tsv) and a category sheet naming tiny prompt files
(--rows demo prompts each). One has --categories categories, the other has 1. Each is dry-run with
`python -m snakemake -n --snakefile Snakefile --directory DIR` (nothing built yet, so the whole DAG
is planned: tokenize, plan, generate, merge, check, export and report jobs of every category),
alternating, median of the repeats. The per-category cost is (many - one) / (categories - 1);
the fixed cost (interpreter, Snakemake, Snakefile, config validation) is in the one-category time.

    .venv/bin/python bench/workflow_overhead.py [--categories 100] [--repeats 3]
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import ROOT, BenchParser, write_figures

SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def demo_rows(n: int) -> list[dict]:
    with open(ROOT / "config" / "prompts" / "math.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()][:n]


def layout(path: Path, n_categories: int, rows: list[dict]) -> Path:
    prompts = path / "config" / "prompts"
    prompts.mkdir(parents=True)
    sheet = ["category\tprompts"]
    for k in range(n_categories):
        name = f"cat{k:03d}"
        with open(prompts / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(dict(row, id=f"{name}-{row['id']}"), ensure_ascii=False) + "\n")
        sheet.append(f"{name}\tconfig/prompts/{name}.jsonl")
    (path / "config" / "categories.tsv").write_text("\n".join(sheet) + "\n")
    with open(ROOT / "config" / "config.yaml") as fh:
        config = yaml.safe_load(fh)
    config["categories"] = "config/categories.tsv"
    (path / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def dry_run(path: Path) -> tuple[float, int]:
    """Seconds of one `snakemake -n`, and the number of jobs it planned."""
    cmd = SNAKEMAKE + ["-n", "--snakefile", str(ROOT / "Snakefile"), "--directory", str(path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"snakemake -n failed in {path} ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    jobs = 0
    for line in (proc.stdout + proc.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            jobs = int(parts[1])
    return seconds, jobs


def main() -> int:
    ap = BenchParser(__doc__, smoke={"categories": 3, "repeats": 1})
    ap.add_argument("--categories", type=int, default=100)
    ap.add_argument("--rows", type=int, default=2, help="prompts per category file")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = demo_rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        many = layout(Path(tmp) / "many", args.categories, rows)
        one = layout(Path(tmp) / "one", 1, rows)
        dry_run(one)  # warm-up: bytecode and file caches
        times = {"one": [], "many": []}
        jobs = {}
        for _ in range(args.repeats):
            for name, path in (("one", one), ("many", many)):
                seconds, jobs[name] = dry_run(path)
                times[name].append(seconds)
    t_one, t_many = statistics.median(times["one"]), statistics.median(times["many"])
    per = (t_many - t_one) / (args.categories - 1)
    print(f"snakemake -n, fresh working directory ({args.rows} prompts per category), median of {args.repeats}")
    print(f"{'categories':>11}{'jobs':>7}{'seconds':>9}{'(min-max)':>14}{'vs 1 category':>15}")
    for name, n in (("one", 1), ("many", args.categories)):
        ts = times[name]
        print(
            f"{n:>11}{jobs[name]:>7}{statistics.median(ts):>9.2f}{f'({min(ts):.2f}-{max(ts):.2f})':>14}{statistics.median(ts) / t_one:>14.2f}x"
        )
    print(
        f"per category: {per * 1000:.0f} ms ({(t_many - t_one) / max(jobs['many'] - jobs['one'], 1) * 1000:.1f} ms per planned job)"
    )
    figures = {"categories": args.categories, "repeats": args.repeats, "jobs_one": jobs["one"]}
    figures |= {"jobs_many": jobs["many"], "one_s": round(t_one, 3), "many_s": round(t_many, 3)}
    write_figures(args, figures | {"per_category_ms": round(per * 1000, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
