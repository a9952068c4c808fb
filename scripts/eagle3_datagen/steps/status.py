"""status: how far a run is, read from the files it writes, from any host that sees them, at any time.

    eagle3-datagen status [--watch [S]] [--configfile config/config.yaml ...] [--json]

Read-only and lock-free, so safe beside running jobs and on NFS (docs/running.md); no Snakemake and
no pandas, so it starts in a fraction of a second.
"""

import argparse
import base64
import csv
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from eagle3_datagen.generation.progress import ShardView, planned_rows, progress_path, read_progress, view
from eagle3_datagen.storage.layout import journal_path
from eagle3_datagen.storage.layout import path as layout_path
from eagle3_datagen.storage.progress import duration

# A shard's output table: made by its generate job, or from the journal alone (generate_cached).
OUTPUTS = ("shard_generations", "cached_shard_generations")
# The steps after generate, per category: (step, its output, the steps it needs besides generate).
AFTER = (
    ("merge_shards", "generations", ()),
    ("check_sequences", "sequence_report", ("merge_shards",)),
    ("check_parsers", "verdict_counts", ("merge_shards",)),
    ("export_dataset", "dataset", ("merge_shards", "check_sequences")),
)


@dataclass
class CategoryView:
    name: str
    shards: list[ShardView] = field(default_factory=list)
    steps: list[tuple[str, str]] = field(default_factory=list)


def read_config(configfiles: list[Path]) -> dict:
    """The configs merged as Snakemake merges `--configfile`s (later keys win, dicts merged)."""
    config: dict = {}
    for path in configfiles:
        with open(path) as fh:
            _merge(config, yaml.safe_load(fh) or {})
    return config


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def categories(config: dict, root: Path) -> list[tuple[str, int]]:
    """(category, shards) of the sheet, in its order."""
    with open(root / config["categories"], newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [(r["category"], int(r.get("shards") or 1)) for r in rows if r.get("category")]


class Markers:
    """Snakemake's markers of outputs whose job is in flight (or was, when Snakemake was killed):
    `.snakemake/incomplete/<urlsafe base64 of the path>`, holding the job's SLURM id once submitted."""

    def __init__(self, root: Path):
        self.dir = root / ".snakemake" / "incomplete"
        self.locked = any((root / ".snakemake" / "locks").glob("*"))
        self.snakemake_pids = snakemake_pids(root) if self.locked else []

    def says(self) -> str:
        """Whether a Snakemake runs here, as the header says it."""
        if self.snakemake_pids:
            return f"Snakemake runs here (pid {', '.join(map(str, self.snakemake_pids))})"
        if self.locked:
            return "Snakemake's lock is left by a run that is gone: `snakemake --unlock`, then rerun"
        return "no Snakemake runs here"

    def job(self, output: str) -> dict | None:
        key = base64.urlsafe_b64encode(output.encode()).decode()
        try:
            return json.loads((self.dir / key).read_text() or "{}")
        except (OSError, ValueError):
            return None


def snakemake_pids(root: Path) -> list[int]:
    """Snakemake processes of this (the submitting) host working in `root`; a lock without one is a killed run's."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) != root:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(Path(arg.decode(errors="replace")).name == "snakemake" for arg in argv[:3]):
            pids.append(int(proc.name))
    return sorted(pids)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def shard_view(root: Path, cache_dir: Path, category: str, shard: int, shards: int, markers: Markers, now: float):
    """One shard's state, from its plan, its progress file, its journal and its output table."""
    journal = root / journal_path(cache_dir, category, shard, shards)
    plan_file = root / layout_path("plan", category=category, shard=shard)
    planned = _mtime(plan_file)
    if planned is None:
        before = "tokenize_prompts" if _mtime(root / layout_path("prompts", category=category)) is None else None
        return ShardView(state="waiting", error=f"on {before or 'plan_generation'}")
    outputs = [layout_path(k, category=category, shard=shard) for k in OUTPUTS]
    finished = [root / p for p in outputs if (_mtime(root / p) or 0) >= planned]
    facts = read_progress(journal)
    # A progress file older than the plan is an earlier attempt's: this plan's job has not started.
    if facts is not None and (_mtime(progress_path(journal)) or 0) >= planned:
        found = view(journal, facts, now=now)
        if finished and found.state == "killed":  # ended after its table was written
            found.state = "done"
        return found
    if finished:
        from eagle3_datagen.storage.tables import count_rows  # pyarrow: only where a table is counted

        rows = count_rows(finished[0])
        return ShardView(state="done", planned=rows, done=rows, output_tokens=None)
    plan = json.loads(plan_file.read_text())
    found = ShardView(
        state="queued",
        planned=planned_rows(plan),
        done=plan["reused"],
        output_tokens=plan.get("reused_output_tokens"),
    )
    marker = next((m for m in map(markers.job, outputs) if m is not None), None)
    if marker is not None and marker.get("external_jobid"):
        found.slurm_job_id = str(marker["external_jobid"])
        found.error = f"submitted as SLURM job {found.slurm_job_id}"
    elif marker is not None and markers.snakemake_pids:
        found.state = "starting"
    return found


def step_states(root: Path, category: str, shards: list[ShardView], markers: Markers) -> list[tuple[str, str]]:
    """The steps after generate: `done` (output newer than its inputs), `running` (Snakemake's
    marker; `interrupted` when no Snakemake runs), `to run`, or what they wait on."""
    tables = [_mtime(root / layout_path(k, category=category, shard=n)) for n in range(len(shards)) for k in OUTPUTS]
    made = {"generate": max((t for t in tables if t is not None), default=0.0)}
    done_shards = sum(s.state == "done" for s in shards)
    states = []
    for step, output, needs in AFTER:
        out = layout_path(output, category=category)
        blockers = [n for n in needs if n not in made]
        if done_shards < len(shards):
            blockers = [f"generate ({done_shards} of {len(shards)} shards done)"]
        mtime = _mtime(root / out)
        if not blockers and mtime is not None and all(mtime >= made[n] for n in ("generate", *needs)):
            made[step] = mtime
            states.append((step, "done"))
        elif blockers:
            states.append((step, "waits on " + blockers[0]))
        elif markers.job(out) is not None:
            states.append((step, "running" if markers.snakemake_pids else "interrupted"))
        else:
            states.append((step, "to run"))
    return states


def run_status(root: Path, config: dict, now: float | None = None) -> list[CategoryView]:
    now = time.time() if now is None else now
    cache_dir = Path(config.get("cache_dir", "cache"))
    markers = Markers(root)
    views = []
    for name, shards in categories(config, root):
        shard_views = [shard_view(root, cache_dir, name, n, shards, markers, now) for n in range(shards)]
        views.append(CategoryView(name, shard_views, step_states(root, name, shard_views, markers)))
    return views


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds, tenths=False)


def _number(value) -> str:
    return "-" if value is None else f"{value:,}"


def _rate(value: float | None) -> str:
    """Rows or tokens per second: two decimals below 10 (a GPU job may finish a row every 20 s)."""
    return "-" if value is None else f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


def _where(s: ShardView, now: float) -> str:
    if s.host is None:
        return s.error or ""
    job = f"SLURM {s.slurm_job_id} on {s.host}" if s.slurm_job_id else f"{s.host} pid {s.pid}"
    ago = _duration(now - s.updated) if s.updated else "-"
    if s.state == "failed":
        return f"{job}, failed {ago} ago: {s.error}"
    if s.state == "killed":
        return f"{job}, gone, last heard {ago} ago: rerun to resume"
    if s.state == "done":
        return f"{job}, ended {ago} ago"
    return job + (f", last word {ago} ago" if now - s.updated > 120 else "")


def _share(done: int, planned: int) -> str:
    return f"{100 * done / planned:.1f}" if planned else "-"


def table(views: list[CategoryView], now: float) -> list[list[str]]:
    head = ["category", "shard", "state", "rows done", "of", "%", "output tokens", "rows/s", "tokens/s", "ETA"]
    rows = [head + ["failed", "retried", "limit", "job"]]
    for category in views:
        for n, s in enumerate(category.shards):
            rows.append(
                [category.name, f"{n}/{len(category.shards)}", s.state, _number(s.done), _number(s.planned)]
                + [_share(s.done, s.planned), _number(s.output_tokens), _rate(s.requests_per_s), _rate(s.tokens_per_s)]
                + [_duration(s.eta_s), _number(s.failed), _number(s.retries), _number(s.limit), _where(s, now)]
            )
    shards = [s for category in views for s in category.shards]
    planned, done = sum(s.planned for s in shards), sum(s.done for s in shards)
    tokens = None if any(s.output_tokens is None for s in shards) else sum(s.output_tokens for s in shards)
    rates = [sum(s.requests_per_s or 0 for s in shards), sum(s.tokens_per_s or 0 for s in shards)]
    eta = (planned - done) / rates[0] if rates[0] else None
    rows.append(
        ["total", "", "", _number(done), _number(planned), _share(done, planned), _number(tokens)]
        + [_rate(rates[0] or None), _rate(rates[1] or None), _duration(eta), _number(sum(s.failed for s in shards))]
        + [_number(sum(s.retries for s in shards)), "", ""]
    )
    return rows


def render(views: list[CategoryView], root: Path, now: float) -> str:
    rows = table(views, now)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    left = {0, 1, 2}
    lines = [f"{root} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}: {Markers(root).says()}", ""]
    for r in rows:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells + [r[-1]]).rstrip())
    lines.append("")
    for category in views:
        lines.append(f"{category.name}: {steps_line(category.steps)}")
    return "\n".join(lines)


def steps_line(steps: list[tuple[str, str]]) -> str:
    """`merge_shards done; check_sequences, check_parsers running; ...`: steps in one state together."""
    parts = []
    for state, group in itertools.groupby(steps, key=lambda step: step[1]):
        names = [name for name, _ in group]
        parts.append(f"{', '.join(names)} {state.replace('waits on', 'wait on') if len(names) > 1 else state}")
    return "; ".join(parts)


def as_json(views: list[CategoryView]) -> list[dict]:
    shards = [[{k: v for k, v in asdict(s).items() if k != "facts"} for s in c.shards] for c in views]
    return [{"category": c.name, "shards": s, "steps": dict(c.steps)} for c, s in zip(views, shards)]


def main(argv: list[str] | None = None, prog: str = "status") -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog=prog)
    parser.add_argument("--directory", "-d", type=Path, default=Path("."), help="the run's working directory")
    parser.add_argument(
        "--configfile", nargs="+", type=Path, help="as given to snakemake (default: config/config.yaml)"
    )
    parser.add_argument("--watch", nargs="?", type=float, const=10.0, help="refresh every S seconds (default 10)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args(argv)
    root = args.directory.resolve()
    config = read_config([root / p for p in args.configfile or [Path("config/config.yaml")]])
    while True:
        now = time.time()
        views = run_status(root, config, now)
        text = json.dumps(as_json(views), indent=1) if args.json else render(views, root, now)
        if args.watch:
            sys.stdout.write("\x1b[H\x1b[2J")
        try:
            print(text, flush=True)
        except BrokenPipeError:  # `status | head`
            return 0
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0
