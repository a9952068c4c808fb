"""The test folders are the tiers: tests/unit runs in `make test-fast` (unit and in-process, every
commit), tests/integration only in `make test` (whole workflows, SLURM, the real SGLang server, the
tiny model's training). The markers agree with the folders, and every marker has a target."""

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
MAKEFILE = (TESTS.parent / "Makefile").read_text()


def marks(path: Path) -> tuple[set[str], set[str]]:
    """(the marks of the module's `pytestmark`, the marks used anywhere in it)."""
    tree = ast.parse(path.read_text())
    module, anywhere = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            anywhere.add(node.attr)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module |= {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute) and n.attr != "mark"}
    return module, anywhere


def modules(folder: str) -> list[Path]:
    return sorted((TESTS / folder).glob("test_*.py"))


@pytest.mark.parametrize("path", modules("integration"), ids=lambda p: p.name)
def test_an_integration_module_is_slow_as_a_whole(path):
    assert "slow" in marks(path)[0], f"{path}: tests/integration runs in make test only: pytestmark = pytest.mark.slow"


@pytest.mark.parametrize("path", modules("unit"), ids=lambda p: p.name)
def test_a_unit_module_has_nothing_slow_nor_the_real_server(path):
    used = marks(path)[1] & {"slow", "real_sglang"}
    assert not used, f"{path} uses {used}: a slow test belongs in tests/integration (make test-fast runs tests/unit)"


def test_a_test_module_name_is_one_across_the_tiers():
    """pytest imports both folders' modules by their base name: one name in both would not load."""
    unit, integration = ({p.name for p in modules(f)} for f in ("unit", "integration"))
    assert not unit & integration, f"named alike in tests/unit and tests/integration: {sorted(unit & integration)}"


def test_the_targets_run_the_tiers_and_every_marker():
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", MAKEFILE, re.MULTILINE).group(1)
    assert "tests/unit" in fast and "integration" not in fast
    declared = re.findall(r'^\s+"(\w+):', (TESTS.parent / "pyproject.toml").read_text(), re.MULTILINE)
    assert set(declared) == {"slow", "real_sglang"}
    for marker in declared:
        assert f"-m {marker}" in MAKEFILE or marker == "slow", f"no make target runs the {marker} marker alone"
    assert any("real_sglang" in marks(p)[0] for p in modules("integration"))
