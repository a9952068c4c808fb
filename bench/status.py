"""What `status` costs on a run of the seeds' scale: 100,000 journalled rows, jobs in flight.

A run directory is built in a temporary folder: --categories categories of --shards shards each, the
rows split evenly over the shards' journals (JSON lines shaped as the client writes them, with
--tokens output ids each), every shard's plan, and the progress file of a generate job that is
sending: published --tail rows before the journal's end, as a job between two publishes leaves it
(so `status` reads those rows from the journal), with the lock held by a live process, as a job on
another node holds it. Measured in the same run, best of --repeats:

  status             steps.status.run_status + render, in-process: what one refresh of --watch costs
  status command     `python -m eagle3_datagen status`, a fresh interpreter: what a user waits for
  baseline           reading every journal once and counting its lines (no JSON parsed): the least a
                     status that read the journals would pay

    .venv/bin/python bench/status.py [--rows 100000] [--tokens 1000] [--categories 4] [--shards 4]
        [--smoke] [--figures FILE]
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.generation.journal import Journal  # noqa: E402
from eagle3_datagen.generation.progress import ShardProgress  # noqa: E402
from eagle3_datagen.steps import status  # noqa: E402
from eagle3_datagen.storage.layout import journal_path, path  # noqa: E402


def build(root: Path, rows: int, tokens: int, categories: int, shards: int, tail: int) -> list[Path]:
    rng = random.Random(0)
    names = [f"cat{c}" for c in range(categories)]
    (root / "config").mkdir(parents=True)
    sheet = ["category\tprompts\tshards"] + [f"{c}\tconfig/prompts/{c}.jsonl\t{shards}" for c in names]
    (root / "config" / "categories.tsv").write_text("\n".join(sheet) + "\n")
    (root / "config" / "config.yaml").write_text(yaml.safe_dump({"categories": "config/categories.tsv"}))
    journals = []
    per_shard = rows // (categories * shards)
    for name in names:
        (root / path("prompts", category=name)).parent.mkdir(parents=True, exist_ok=True)
        (root / path("prompts", category=name)).write_bytes(b"")
        for shard in range(shards):
            plan = {"to_send": per_shard + 50, "reused": 0, "skipped": 0, "later_turns": 0}
            plan_file = root / path("plan", category=name, shard=shard)
            plan_file.parent.mkdir(parents=True, exist_ok=True)
            plan_file.write_text(json.dumps(plan))
            journal = root / journal_path("cache", name, shard, shards)
            journal.parent.mkdir(parents=True, exist_ok=True)
            # Written by the journal itself, as the client writes it (no fsync: the page cache is what
            # status reads from here).
            with Journal(journal, sync_every=1 << 62, sync_interval_s=float("inf")) as writer:
                for i in range(per_shard - tail):
                    writer.append(_entry(rng, name, shard, i, tokens))
                progress = ShardProgress(journal, category=name, shard=shard, shards=shards, plan=plan)
                progress.update({"done": per_shard - tail, "output_tokens": (per_shard - tail) * tokens}, force=True)
                for i in range(per_shard - tail, per_shard):
                    writer.append(_entry(rng, name, shard, i, tokens))
            journals.append(journal)
    return journals


def _entry(rng: random.Random, name: str, shard: int, i: int, tokens: int) -> dict:
    ids = [rng.randrange(150_000) for _ in range(rng.randint(tokens // 2, tokens * 3 // 2))]
    entry = {
        "id": f"{name}-{shard}-{i}",
        "sample_index": 0,
        "fingerprint": f"{rng.getrandbits(128):032x}",
        "status": "ok",
        "output_ids": ids,
        "finish_type": "stop",
        "meta_info": {"prompt_tokens": 300, "completion_tokens": len(ids)},
    }
    return entry


def hold_locks(journals: list[Path]) -> subprocess.Popen:
    code = (
        f"import sys, time; sys.path.insert(0, {str(ROOT / 'scripts')!r});"
        "from eagle3_datagen.generation.locks import ShardLock;"
        f"locks = [ShardLock(p).acquire() for p in {[str(j) for j in journals]!r}];"
        "print('held', flush=True); time.sleep(3600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def count_lines(journals: list[Path]) -> int:
    lines = 0
    for journal in journals:
        with open(journal, "rb") as fh:
            while chunk := fh.read(1 << 22):
                lines += chunk.count(b"\n")
    return lines


def main() -> None:
    parser = BenchParser(__doc__, smoke={"rows": 400, "tokens": 50, "categories": 2, "shards": 2, "repeats": 1})
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--categories", type=int, default=4)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--tail", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        journals = build(root, args.rows, args.tokens, args.categories, args.shards, args.tail)
        size = sum(j.stat().st_size for j in journals)
        print(f"built {len(journals)} journals, {size / 1e9:.2f} GB, in {time.perf_counter() - started:.0f} s")
        holder = hold_locks(journals)
        try:
            config = status.read_config([root / "config" / "config.yaml"])
            views = status.run_status(root, config)
            done = sum(s.done for v in views for s in v.shards)
            states = {s.state for v in views for s in v.shards}
            assert done == count_lines(journals) and states == {"sending"}, (done, states)
            in_process = best(lambda: status.render(status.run_status(root, config), root, time.time()), args.repeats)
            command = [sys.executable, "-m", "eagle3_datagen", "status", "--directory", str(root)]
            cli = best(lambda: subprocess.run(command, check=True, capture_output=True), args.repeats)
            baseline = best(lambda: count_lines(journals), args.repeats)
        finally:
            holder.kill()
            holder.wait()
    print(f"rows journalled: {done:,} in {len(journals)} shards ({size / 1e9:.2f} GB)")
    print(f"status (in-process):  {in_process * 1000:8.1f} ms")
    print(f"status command:       {cli * 1000:8.1f} ms")
    print(f"baseline (read once): {baseline * 1000:8.1f} ms")
    print(f"status / baseline:    {in_process / baseline:8.4f}  (command: {cli / baseline:.3f})")
    figures = {"rows": done, "journals": len(journals), "journal_bytes": size, "status_s": round(in_process, 4)}
    figures |= {"command_s": round(cli, 4), "baseline_s": round(baseline, 4)}
    write_figures(args, figures | {"status_over_baseline": round(in_process / baseline, 4)})


if __name__ == "__main__":
    main()
