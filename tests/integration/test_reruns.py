"""Only what changed runs again: each edit a user makes, and the requests it costs.

Every test edits its own copy of one finished run; the local engine's record counts what each run
sent. A rerun asks for what its test reads (the generations, or the datasets), so the checks, plots
and summaries after them run only where the test is about them: what a whole run does after an edit
is the same up to there, and it is what costs each rerun its time.
"""

import os
import shutil

import pytest
from workdir import ROOT, Workdir, row_label

from eagle3_datagen.generation.requests import parse_rid

pytestmark = pytest.mark.slow

# Two: one a test edits, one it must leave alone (each category more is a chain of jobs more per run).
CATEGORIES = ("alpha", "beta")


def generations(*categories):
    return [f"results/generations/{c}.parquet" for c in categories or CATEGORIES]


def datasets(*categories):
    return [f"results/dataset/{c}.jsonl" for c in categories or CATEGORIES]


def prompts(prefix, n, start=0):
    return [
        {
            "id": f"{prefix}-{i:03d}",
            "messages": [{"role": "user", "content": f"{prefix} question {i}: how do {i} and {i + 2} compare?"}],
        }
        for i in range(start, start + n)
    ]


class Counter:
    """Requests the engines served since the last call, per category."""

    def __init__(self, wd):
        self.wd = wd
        self.seen = len(wd.engine_record())

    def new(self) -> dict[str, list[str]]:
        entries = self.wd.engine_record()
        fresh, self.seen = entries[self.seen :], len(entries)
        out = {}
        for entry in fresh:
            key = row_label(entry["rid"])
            category = next(c for c, ids in self.wd.ids.items() if parse_rid(entry["rid"])[0][0] in ids)
            out.setdefault(category, []).append(key)
        return out


def snapshot(wd, categories):
    return {
        c: (
            (wd.path / "results" / "generations" / f"{c}.parquet").read_bytes(),
            (wd.path / "results" / "dataset" / f"{c}.jsonl").read_bytes(),
        )
        for c in categories
    }


def copy_workflow(dest):
    """The workflow's own files, copied: a test may touch its scripts without touching the repository's."""
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "Snakefile", dest / "Snakefile")
    for folder in ("rules", "scripts", "schemas", "report", "envs"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, qwen3_tokenizer_dir):
    """One finished run of three categories; every test starts from its own copy of it."""
    root = tmp_path_factory.mktemp("reruns")
    workflow = copy_workflow(root / "workflow")
    wd = Workdir(
        root / "run",
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={c: prompts(c, 6) for c in CATEGORIES},
        plain_qwen3=True,
    )
    wd.snakefile = workflow / "Snakefile"
    counter = Counter(wd)
    wd.snakemake("--cores", "2")
    assert {c: len(r) for c, r in counter.new().items()} == {c: 6 for c in CATEGORIES}
    return wd


@pytest.fixture
def run(baseline, tmp_path):
    """A copy of the finished run (and of its workflow), mtimes kept: edits here touch nothing else."""
    wd = baseline.copy(tmp_path / "run")
    wd.snakefile = copy_workflow(tmp_path / "workflow") / "Snakefile"
    for source, copy in zip(sorted((baseline.snakefile.parent).rglob("*")), sorted(wd.snakefile.parent.rglob("*"))):
        os.utime(copy, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns))
    return wd, Counter(wd)


def test_a_run_with_nothing_changed_does_nothing(run):
    wd, counter = run
    proc = wd.snakemake("--cores", "2")
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert counter.new() == {}


def test_edit_one_prompt_sends_one_request(run):
    wd, counter = run
    before = snapshot(wd, ("beta",))
    rows = prompts("alpha", 6)
    rows[2]["messages"][0]["content"] += " Please be brief."
    wd.write_prompts("alpha", rows)
    wd.snakemake("--cores", "2", *datasets())
    assert counter.new() == {"alpha": ["alpha-002.0"]}
    assert snapshot(wd, ("beta",)) == before
    assert len(wd.jsonl("results/dataset/alpha.jsonl")) == 6


def test_add_five_prompts_sends_five_requests(run):
    wd, counter = run
    wd.write_prompts("beta", prompts("beta", 11))
    wd.snakemake("--cores", "2", *generations())
    new = counter.new()
    assert list(new) == ["beta"] and sorted(new["beta"]) == [f"beta-{i:03d}.0" for i in range(6, 11)]


def test_touching_every_prompt_file_sends_nothing(run):
    wd, counter = run
    for c in CATEGORIES:
        os.utime(wd.path / "config" / "prompts" / f"{c}.jsonl")
    wd.snakemake("--cores", "2", *generations())
    assert counter.new() == {}


def test_editing_the_rules_script_reruns_the_steps_and_sends_nothing(run):
    """Every rule runs scripts/step.py, which Snakemake tracks by modification time: touched, the
    checks and the summary are made again, and generate runs again from the journal alone."""
    wd, counter = run
    generations = {c: (wd.path / "results" / "generations" / f"{c}.parquet").stat().st_mtime_ns for c in CATEGORIES}
    summary = (wd.path / "results" / "summary.tsv").stat().st_mtime_ns
    checked = (wd.path / "results" / "checks" / "alpha.sequences.json").stat().st_mtime_ns
    os.utime(wd.snakefile.parent / "scripts" / "step.py")
    wd.snakemake("--cores", "2", "results/summary.tsv", *[f"results/checks/{c}.sequences.json" for c in CATEGORIES])
    assert counter.new() == {}  # every row came from the cache
    for c in CATEGORIES:
        assert (wd.path / "results" / "generations" / f"{c}.parquet").stat().st_mtime_ns > generations[c]
    assert (wd.path / "results" / "summary.tsv").stat().st_mtime_ns > summary
    assert (wd.path / "results" / "checks" / "alpha.sequences.json").stat().st_mtime_ns > checked


def test_changing_one_categorys_temperature_regenerates_only_it(run):
    wd, counter = run
    sheet = wd.path / "config" / "categories.tsv"
    sheet.write_text(
        sheet.read_text()
        .replace("category\tprompts\n", "category\tprompts\ttemperature\n")
        .replace("beta.jsonl\n", "beta.jsonl\t0.3\n")
        .replace(".jsonl\n", ".jsonl\t\n")
    )
    before = snapshot(wd, ("alpha",))
    wd.snakemake("--cores", "2", *datasets())
    new = counter.new()
    assert list(new) == ["beta"] and sorted(new["beta"]) == [f"beta-{i:03d}.0" for i in range(6)]
    assert snapshot(wd, ("alpha",)) == before


def test_a_new_category_sends_only_its_prompts(run):
    wd, counter = run
    wd.write_prompts("delta", prompts("delta", 4))
    sheet = wd.path / "config" / "categories.tsv"
    sheet.write_text(sheet.read_text() + "delta\tconfig/prompts/delta.jsonl\n")
    wd.snakemake("--cores", "2", *generations(*CATEGORIES, "delta"))
    new = counter.new()
    assert list(new) == ["delta"] and len(new["delta"]) == 4


def test_removing_results_throws_no_generation_away(run):
    wd, counter = run
    from eagle3_datagen.storage.tables import read_rows

    def rows():
        return {c: read_rows(wd.path / "results" / "generations" / f"{c}.parquet") for c in CATEGORIES}

    before, dataset = rows(), {c: (wd.path / "results" / "dataset" / f"{c}.jsonl").read_bytes() for c in CATEGORIES}
    shutil.rmtree(wd.path / "results")
    wd.snakemake("--cores", "2", *datasets())
    assert counter.new() == {}
    # The same rows, from the cache (only the run's provenance, such as its plan, is new).
    assert rows() == before
    assert {c: (wd.path / "results" / "dataset" / f"{c}.jsonl").read_bytes() for c in CATEGORIES} == dataset


def test_a_torn_cache_file_is_recovered_without_losing_other_entries(run):
    wd, counter = run
    journal = wd.path / "cache" / "journal" / "alpha" / "shard_0-of-1.jsonl"
    with open(journal, "ab") as fh:
        fh.write(b'{"id": "alpha-001", "sample_index": 0, "status": "ok", "output_ids": [1, 2')
    wd.snakemake("--cores", "2", "--forcerun", "generate", "--", *generations())
    assert counter.new() == {}
    assert journal.read_bytes().endswith(b"\n")
    assert "torn tail" in (wd.path / "logs" / "generate" / "alpha" / "shard_0.log").read_text()


def test_the_preview_tells_the_cost_before_any_request(run):
    wd, counter = run
    edited = prompts("alpha", 6)
    edited[2]["messages"][0]["content"] += " Please be brief."
    wd.write_prompts("alpha", edited)
    wd.snakemake("--cores", "2", *generations())
    assert counter.new() == {"alpha": ["alpha-002.0"]}
    rows = prompts("alpha", 8)
    wd.write_prompts("alpha", rows)
    wd.snakemake("--cores", "1", "results/plan.tsv")
    assert counter.new() == {}  # previewing sends nothing
    preview = {
        line.split("\t")[0]: line.split("\t") for line in (wd.path / "results" / "plan.tsv").read_text().splitlines()
    }
    header = preview.pop("category")
    alpha = dict(zip(header, preview["alpha"]))
    # Two new rows; the edit of alpha-002 is undone, and its original answer is still in the cache.
    assert (int(alpha["to_send"]), int(alpha["reused"])) == (2, 6)
    wd.snakemake("--cores", "2", *generations())
    assert sorted(counter.new()["alpha"]) == ["alpha-006.0", "alpha-007.0"]


def test_changing_the_model_fingerprint_regenerates_everything(run):
    wd, counter = run
    wd.config["model"]["name"] = "another-model"
    wd.write_config()
    wd.snakemake("--cores", "2", *generations())
    new = counter.new()
    assert {c: len(v) for c, v in new.items()} == {c: 6 for c in CATEGORIES}


def test_the_pilot_is_not_paid_twice(tmp_path, qwen3_tokenizer_dir):
    """snakemake pilot, then the full run: the full run sends only what the pilot did not."""
    import json

    wd = Workdir(
        tmp_path / "run",
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={c: prompts(c, 20) for c in ("alpha", "beta")},
        plain_qwen3=True,
        pilot={"fraction": 0.2, "min_rows": 3},
    )
    counter = Counter(wd)
    wd.snakemake("--cores", "2", "pilot")
    pilot = counter.new()
    assert {c: len(keys) for c, keys in pilot.items()} == {"alpha": 4, "beta": 4}
    table = (wd.path / "results" / "pilot" / "projection.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in table] == ["category", "alpha", "beta", "total"]
    assert json.loads((wd.path / "results" / "pilot" / "alpha.json").read_text())["sampled"] == 4
    wd.snakemake("--report", "pilot.html", "pilot")
    assert "projection" in (wd.path / "pilot.html").read_text(errors="replace")
    wd.snakemake("--cores", "2", *generations("alpha", "beta"))
    full = counter.new()
    for category in ("alpha", "beta"):
        assert len(full[category]) == 16 and not set(full[category]) & set(pilot[category])
