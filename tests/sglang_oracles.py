"""SGLang's own parser classes, installed for the parity test (tests/integration/test_sglang_parity.py).

    python tests/sglang_oracles.py        # installs every version of parser_corpus.VERSIONS (make test does)

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


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    import parser_corpus

    for version in parser_corpus.VERSIONS:
        print(f"SGLang {version}: {install(version)}")
