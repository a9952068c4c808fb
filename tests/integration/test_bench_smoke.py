"""Every benchmark in bench/ still runs: each script at its smallest sizes (`--smoke`) finishes and
writes its figures (`--figures`) with exactly the fields bench/README.md's table lists for it, so the
README and what a bench writes cannot drift apart. The scripts are found by glob (helpers' names
start with `_`), so a new benchmark is run here without being added.

A bench whose prepared input is missing (the speculators wheel, the real data) exits with
MISSING_INPUT and one line naming the make target; `make test` makes them first, so there it runs.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench_table import BENCH, BENCHES, documented_fields, harness

pytestmark = pytest.mark.slow


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
