"""Every benchmark in bench/ still runs: each script at its smallest sizes (`--smoke`) finishes and
writes its figures (`--figures`) with exactly the fields bench/README.md's table lists for it, so the
README and what a bench writes cannot drift apart. The scripts are found by glob (helpers' names
start with `_`), so a new benchmark is run here without being added.

A bench whose prepared input is missing (the speculators wheel, the real data) exits with
MISSING_INPUT and one line naming the make target; `make test` makes them first, so there it runs.
"""

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# bench/ is not put on this process's path: its scripts' names (status, storage, ...) would shadow.
_spec = importlib.util.spec_from_file_location("bench_harness", BENCH / "_harness.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)
BENCHES = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def readme_table() -> dict[str, dict[str, str]]:
    """bench/README.md's opening table: per script, its cells by column header."""
    lines = (BENCH / "README.md").read_text(encoding="utf-8").splitlines()
    rows = []
    for line in lines:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, body = rows[0], rows[2:]
    table = {}
    for cells in body:
        script = re.search(r"`(\w+\.py)`", cells[0])
        assert script, f"bench/README.md: a table row names no script: {cells[0]!r}"
        table[script.group(1)] = dict(zip(header, cells, strict=True))
    return table


def documented_fields(script: str) -> set[str]:
    return set(re.findall(r"`(\w+)`", readme_table()[script]["figures (`--figures`)"]))


def test_the_readme_table_lists_every_benchmark_with_its_figures():
    table = readme_table()
    assert sorted(table) == BENCHES
    for script in BENCHES:
        assert documented_fields(script), f"bench/README.md lists no figures for {script}"
        assert re.fullmatch(r"`[0-9a-f]{7,}`.*", table[script]["measured at"]), (script, table[script])


def test_benchmarks_reach_the_library_only_through_its_public_names():
    """A bench gets a fact from the library (a served request's row, a step's peak memory) through a
    public function: no private name of eagle3_datagen imported or reached into, as one that re-reads
    an internal format breaks unseen when the format grows."""
    found = []
    for script in sorted(BENCH.glob("*.py")):
        tree = ast.parse(script.read_text(encoding="utf-8"))
        library = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eagle3_datagen"):
                library |= {alias.asname or alias.name for alias in node.names}
                found += [f"{script.name}: imports {a.name}" for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Import):
                library |= {a.asname or a.name for a in node.names if a.name.startswith("eagle3_datagen")}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in library
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{script.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not found, found


def test_a_missing_prepared_input_is_one_line_naming_its_make_target(tmp_path):
    absent = tmp_path / "sharegpt.json"
    cmd = [sys.executable, str(BENCH / "scale.py"), "--smoke", "--real", str(absent)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == harness.MISSING_INPUT, done.stderr
    assert done.stderr.splitlines() == [
        f"scale.py: the real prompt file is missing ({absent}): run `make realdata` first"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHES)
def test_benchmark_runs_at_its_smallest_sizes(script, tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(BENCH / script), "--smoke", "--figures", str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    if done.returncode == harness.MISSING_INPUT:
        lines = done.stderr.strip().splitlines()
        missing = re.search(r"\((/[^)]+)\): run `make [\w-]+` first$", lines[-1])
        assert len(lines) == 1 and missing, done.stderr
        assert not Path(missing.group(1)).exists(), f"{script} called present input missing: {lines[0]}"
        pytest.skip(lines[0])
    assert done.returncode == 0, (
        f"{script} --smoke exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    figures = json.loads(out.read_text())
    assert set(figures) == documented_fields(script), f"{script} wrote {sorted(figures)}"
