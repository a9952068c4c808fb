"""The benchmarks' table and code, checked without running them: bench/README.md's table lists every
bench with its figures and the commit they were measured at, no bench reaches into a private name
of the library, and a missing prepared input is one line naming its make target."""

import ast
import re
import subprocess
import sys

from bench_table import BENCH, BENCHES, documented_fields, harness, readme_table


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
