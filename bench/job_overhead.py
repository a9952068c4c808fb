"""Fixed cost of a local job: each rule's script as Snakemake runs it, against a bare transformers import.

A tiny working directory (one category, --rows demo prompts, the scripted engine, the real Qwen3
tokenizer; or the Kimi-shaped one with --tokenizer kimi) is run once through the whole workflow with
`--skip-script-cleanup`, which leaves every job's script as Snakemake wrote it (its preamble
unpickles the job's Snakemake object) in .snakemake/scripts/. Each of these scripts is then run
again by itself, exactly as the job ran it, alternating with the baseline
`python -c "import transformers"`, median of the repeats. A job of a few rows does almost no work,
so its wall time is its fixed cost: interpreter start, imports, config, tokenizer load.

    .venv/bin/python bench/job_overhead.py [--repeats 5] [--rows 5] [--tokenizer qwen3|kimi]
"""

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests" / "integration")]

from workdir import Workdir  # noqa: E402

from eagle3_datagen.demo.tokenizers import build_kimi_shaped_tokenizer, qwen3_tokenizer_dir  # noqa: E402


def timed(cmd: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = BenchParser(__doc__, smoke={"repeats": 1, "rows": 2})
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--tokenizer", choices=("qwen3", "kimi"), default="qwen3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.tokenizer == "kimi":
            tokenizer, plain = build_kimi_shaped_tokenizer(tmp / "kimi"), False
        else:
            tokenizer, plain = qwen3_tokenizer_dir(), True
        with open(ROOT / "config" / "prompts" / "math.jsonl", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh][: args.rows]
        wd = Workdir(
            tmp / "run",
            tokenizer=tokenizer,
            model_dir=None,
            backend="scripted",
            categories={"math": rows},
            plain_qwen3=plain,
        )
        started = time.perf_counter()
        wd.snakemake("--cores", "1", "--skip-script-cleanup")
        whole = time.perf_counter() - started
        scripts = {p.name.split(".")[-2]: p for p in sorted((wd.path / ".snakemake" / "scripts").glob("*.py"))}
        baseline_cmd = [sys.executable, "-c", "import transformers"]
        times = {name: [] for name in scripts}
        base = []
        for _ in range(args.repeats):
            base.append(timed(baseline_cmd, wd.path))
            for name, script in scripts.items():
                times[name].append(timed([sys.executable, str(script)], wd.path))
        shutil.rmtree(wd.path / ".snakemake" / "scripts", ignore_errors=True)
    b = statistics.median(base)
    print(
        f"tokenizer {args.tokenizer}, {args.rows} rows, median of {args.repeats}; whole workflow run once: {whole:.1f} s"
    )
    print(f"{'job':20}{'wall s':>8}{'x import transformers':>24}")
    print(f"{'(import transformers)':20}{b:>8.2f}{1.0:>24.2f}")
    for name, ts in sorted(times.items(), key=lambda kv: -statistics.median(kv[1])):
        m = statistics.median(ts)
        print(f"{name:20}{m:>8.2f}{m / b:>24.2f}")
    figures = {"tokenizer": args.tokenizer, "rows": args.rows, "repeats": args.repeats}
    figures |= {"whole_workflow_s": round(whole, 2), "import_transformers_s": round(b, 3)}
    figures["job_s"] = {name: round(statistics.median(ts), 3) for name, ts in sorted(times.items())}
    write_figures(args, figures)


if __name__ == "__main__":
    main()
