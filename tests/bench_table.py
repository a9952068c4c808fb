"""bench/README.md's opening table, read for the benchmark tests (tests/unit/test_bench.py: the table
and the benches agree; tests/integration/test_bench_smoke.py: each bench runs and writes its fields)."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
