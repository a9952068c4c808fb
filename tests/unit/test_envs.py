"""envs/*.yaml (for cluster users, conda-forge) and pyproject.toml (pip install) must pin what
requirements.txt pins."""

import re
from pathlib import Path

import pytest
import yaml

from pins import parse_pins, pyproject, requirement_pins

ROOT = Path(__file__).resolve().parents[2]
# conda-forge names of PyPI packages, where they differ.
CONDA_NAMES = {"matplotlib-base": "matplotlib"}


def env_pins(path: Path) -> dict[str, str]:
    spec = yaml.safe_load(path.read_text())
    pins = {}
    for dep in spec["dependencies"]:
        if isinstance(dep, dict):
            for pip_dep in dep.get("pip", []):
                name, version = pip_dep.split("==")
                pins[name.lower()] = version
        else:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:=([^=]+))?", dep)
            assert m, f"{path.name}: cannot read dependency {dep!r}"
            if m.group(1) not in ("python", "pip"):
                assert m.group(2), f"{path.name}: {dep} is not pinned"
                pins[CONDA_NAMES.get(m.group(1), m.group(1)).lower()] = m.group(2)
    return pins


@pytest.mark.parametrize("env", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_env_pins_agree_with_requirements(env):
    required = requirement_pins()
    pins = env_pins(env)
    assert pins, env
    for name, version in pins.items():
        assert name in required, f"{env.name} pins {name}, which requirements.txt does not"
        assert version == required[name], f"{env.name} pins {name}={version}, requirements.txt {required[name]}"
    spec = yaml.safe_load(env.read_text())
    assert spec["channels"] == ["conda-forge", "nodefaults"]


def test_every_rule_env_exists():
    for smk in (ROOT / "rules").glob("*.smk"):
        for env in re.findall(r'"\.\./(envs/[^"]+)"', smk.read_text()):
            assert (ROOT / env).exists(), f"{smk.name} names {env}, which does not exist"


def test_pyproject_pins_what_requirements_pins():
    """The installed command needs the pipeline's pins, the `test` extra the test tools': together
    they are requirements.txt, each pin once."""
    project = pyproject()["project"]
    runtime = parse_pins(project["dependencies"])
    tools = parse_pins(project["optional-dependencies"]["test"])
    assert runtime and tools and not set(runtime) & set(tools), (runtime, tools)
    assert {**runtime, **tools} == requirement_pins()
    assert {"pytest", "hypothesis", "ruff", "snakefmt", "pytest-xdist"} == set(tools)
