"""The pins of requirements.txt, which envs/*.yaml, pyproject.toml and the built wheel must repeat."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def parse_pins(requirements: list[str]) -> dict[str, str]:
    """`name==version` strings (a wheel's Requires-Dist, its `; extra == ...` marker aside) as a dict."""
    pins = {}
    for requirement in requirements:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)\s*(;.*)?", requirement.strip())
        assert m, f"not pinned exactly: {requirement!r}"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())
