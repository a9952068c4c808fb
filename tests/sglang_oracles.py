"""SGLang's own parser classes, installed for the parity test (tests/integration/test_sglang_parity.py),
and the trainers' own data code, for the handoff test (tests/integration/test_trainers.py).

    python tests/sglang_oracles.py        # installs every version of parser_corpus.VERSIONS and TRAINERS (make test does)

Each version goes into `<repo>/.cache/sglang/<version>` with `pip install --no-deps --target`, plus
the few pure-Python packages its parser modules import; an installed version is left as it is.
Installing happens here, before the suite runs, never while tests run.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "sglang"
# What the parser modules import besides the standard library and what the project already has
# (pydantic, numpy, transformers, jinja2): checked for 0.5.8 and 0.5.23.
EXTRA_PACKAGES = ["openai", "orjson", "partial_json_parser", "msgspec", "pybase64", "ipython"]


def imports(target: Path) -> bool:
    """Whether the parser modules of the SGLang in `target` import (without sglang/__init__.py)."""
    probe = (
        "import sys, types; sys.path.insert(0, sys.argv[1]); m = types.ModuleType('sglang'); "
        "m.__path__ = [sys.argv[1] + '/sglang']; sys.modules['sglang'] = m; "
        "import sglang.srt.parser.reasoning_parser, sglang.srt.function_call.kimik2_detector, "
        "sglang.srt.function_call.qwen25_detector"
    )
    return (
        target.is_dir()
        and subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True).returncode == 0
    )


def install(version: str) -> Path:
    target = CACHE / version
    if imports(target):
        return target
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(target)]
    for args in (["--no-deps", f"sglang=={version}"], EXTRA_PACKAGES):
        done = subprocess.run(pip + ["--upgrade", *args], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    if not imports(target):
        raise SystemExit(f"SGLang {version} installed in {target} but its parser modules do not import")
    return target


def installed(version: str) -> Path:
    """The installed SGLang `version`; an AssertionError naming the install command if it is missing."""
    target = CACHE / version
    assert imports(target), (
        f"SGLang {version}'s parsers are not installed in {target}: run `.venv/bin/python tests/sglang_oracles.py`"
    )
    return target


# The trainers whose loaders read the export: each wheel unpacked with --no-deps into
# <repo>/.cache/trainers/<name>-<version>; the test loads the few modules it runs by their paths.
TRAINERS = {"specforge": "0.2.0", "speculators": "0.9.0"}
TRAINER_CACHE = ROOT / ".cache" / "trainers"


def install_trainer(name: str, version: str) -> Path:
    target = TRAINER_CACHE / f"{name}-{version}"
    if (target / name / "__init__.py").exists():
        return target
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    done = subprocess.run(
        pip + ["--target", str(target), f"{name}=={version}"], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"pip install {name}=={version} failed:\n{done.stderr[-3000:]}")
    return target


def trainer(name: str) -> Path:
    """The installed trainer package's folder; an AssertionError naming the install command if missing."""
    target = TRAINER_CACHE / f"{name}-{TRAINERS[name]}"
    assert (target / name / "__init__.py").exists(), (
        f"{name} {TRAINERS[name]} is not installed in {target}: run `.venv/bin/python tests/sglang_oracles.py`"
    )
    return target / name


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    import parser_corpus

    for version in parser_corpus.VERSIONS:
        print(f"SGLang {version}: {install(version)}")
    for name, version in TRAINERS.items():
        print(f"{name} {version}: {install_trainer(name, version)}")
