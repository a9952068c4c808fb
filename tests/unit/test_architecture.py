"""The library's shape, checked: imports run one way (each layer imports only its own and lower
layers, with no cycles), every module says what it owns, and no module or function outgrows one
purpose (400 and 80 lines)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "scripts" / "eagle3_datagen"

# Lowest first: a module may import from its own layer and those below it.
LAYERS = {
    "settings": 0,
    "sampling": 0,
    "engine_settings": 0,
    "storage": 1,
    "tokens": 2,
    "quality": 2,
    "demo": 2,
    "generation": 3,
    "figures": 4,
    "steps": 5,
    "workflow": 6,
    "runner": 6,
    "cli": 7,
    "__main__": 8,
}
# The CPU stand-in of SGLang stands apart: it may use the settings and itself, nothing else.
ENGINE_MAY_IMPORT = {"settings", "engine_settings", "engine"}
# Nothing of the pipeline depends on the stand-in; only the command line imports it, to run it.
ENGINE_IMPORTED_BY = {"cli"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that `path` (module `name`) imports, at module level or in a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def area(module: str) -> str:
    """`eagle3_datagen.generation.client` -> `generation`; the package itself -> ``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = modules()
GRAPH = {name: imported(path, name, set(MODULES)) for name, path in MODULES.items()}


def test_every_module_belongs_to_a_layer():
    unplaced = sorted(m for m in MODULES if area(m) and area(m) not in LAYERS and area(m) != "engine")
    assert not unplaced, f"modules outside every layer (add the area to LAYERS with its place): {unplaced}"


def test_imports_run_down_the_layers():
    upward = []
    for name, targets in GRAPH.items():
        here = area(name)
        for target in targets:
            there = area(target)
            if not there:
                continue  # the package's own __init__
            if here == "engine":
                if there not in ENGINE_MAY_IMPORT:
                    upward.append(f"{name} -> {target}")
            elif there == "engine":
                if here not in ENGINE_IMPORTED_BY:
                    upward.append(f"{name} -> {target}")
            elif here in LAYERS and LAYERS[there] > LAYERS[here]:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def step_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of one step module by another (the package `steps` itself holds no step)."""
    return sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("eagle3_datagen.steps.")
        for target in targets
        if target.startswith("eagle3_datagen.steps.")
    )


def test_no_step_imports_a_step():
    """A step is one rule's function; what several steps share lives a layer down (the plan and the
    journal in generation.planning, a shard's run in generation.run, series names in figures.base,
    the trainer row and file hashes in storage), so that a step can change without moving another."""
    found = step_imports(GRAPH)
    assert not found, "steps that import steps (move what they share a layer down):\n" + "\n".join(found)


# A subscript (after a name, ] or ), not a list literal such as engines == ["local"].
RAW_ENGINE_READ = re.compile(r"""engine\[|engine\.get\(|(?<=[\w\])])\[["'](?:kind|sglang|local|external)["']\]""")


def test_the_engine_block_is_read_through_its_types_alone():
    """engine_settings builds one type per engine kind from the config; nothing else reads the dict
    or branches on the kind's name (the rules included)."""
    sources = {
        name: path for name, path in MODULES.items() if area(name) not in ("engine", "settings", "engine_settings")
    }
    sources |= {path.name: path for path in (PACKAGE.parents[1] / "rules").glob("*.smk")}
    raw = [
        f"{name}:{n}: {line.strip()}"
        for name, path in sources.items()
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if RAW_ENGINE_READ.search(line)
    ]
    assert not raw, "raw reads of the engine block (use engine_settings.EngineSettings):\n" + "\n".join(raw)
    assert RAW_ENGINE_READ.search('if engine["kind"] == "local"') and RAW_ENGINE_READ.search("x = cfg['sglang']")
    assert not RAW_ENGINE_READ.search('engines == ["local"]')


def test_there_are_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [name, target]))
            elif target not in state:
                visit(target, path + [name])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_has_one_purpose_it_names(name):
    path = MODULES[name]
    text = path.read_text()
    tree = ast.parse(text)
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{path} has {lines} lines (at most {MAX_MODULE_LINES}): split it where its purposes part"
    )
    assert ast.get_docstring(tree), f"{path} has no docstring saying what it owns"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_checks_would_catch_a_violation(tmp_path):
    """The graph walk sees relative and absolute imports, in functions too."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from eagle3_datagen.steps import generate\n")
    assert imported(probe, "eagle3_datagen.storage.probe", set(MODULES)) >= {"eagle3_datagen.steps.generate"}
    probe.write_text("from ..generation.client import GenerateClient\n")
    assert "eagle3_datagen.generation.client" in imported(probe, "eagle3_datagen.storage.probe", set(MODULES))
    probe.write_text("from eagle3_datagen.steps.plan_generation import plan_generation\n")
    graph = {"eagle3_datagen.steps.pilot": imported(probe, "eagle3_datagen.steps.pilot", set(MODULES))}
    assert step_imports(graph) == ["eagle3_datagen.steps.pilot -> eagle3_datagen.steps.plan_generation"]
