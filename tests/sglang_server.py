"""The real SGLang server for the suite's real-SGLang tier (tests/integration/test_real_sglang.py).

    python tests/sglang_server.py      # installs it (make test does, before the suite); prints its python

SGLang pins its own torch and transformers, so it gets an interpreter of its own, as on a cluster:
a venv in `<repo>/.cache/sglang-server/<version>/` with torch held at the project's CPU build,
SGLang's pure-Python requirements pinned in tests/sglang_cpu/requirements.txt and `sglang` itself
installed without its GPU-only requirements. An installed, working venv is left as it is (about
five minutes and 3 GB the first time). Installing happens here, before the suite runs, never while
tests run.

Two things let SGLang run on a machine without a GPU; both are test-side and the product depends
on neither:
- tests/sglang_cpu/shim/sgl_kernel: the two kernel functions SGLang's CPU engine imports without
  a guard, in plain PyTorch (PyPI's kernel packages are CUDA builds); on the server's PYTHONPATH.
- the torchvision guard: PyPI's torchvision is a CUDA build whose `import` fails against CPU torch
  on two unguarded `register_fake` calls for operators its C library would define; SGLang imports
  `torchvision.transforms` at start-up. The install wraps those two calls (see `guard_torchvision`).

What the CPU needs at launch comes through the config, as a cluster user's settings would:
`engine.sglang.env` (CPU_ENV) and `engine.sglang.extra_args` (CPU_ARGS).
"""

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "sglang_cpu"
REQUIREMENTS = HERE / "requirements.txt"
SHIM = HERE / "shim"
TARGET = ROOT / ".cache" / "sglang-server" / VERSION
# Installed with --no-deps: SGLang's own requirements name the CUDA torch, kernels and torchvision.
TORCH = "torch==2.13.0"
NO_DEPS = [f"sglang=={VERSION}", "torchvision==0.28.0"]

# The server's environment and flags on CPU (../shared/notes/sglang-cpu.md): the CPU engine, plain
# PyTorch attention (the x86 default is intel_amx), no CUDA graphs, float32 for exact comparison
# with transformers, no warm-up request.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(SHIM)}
CPU_ARGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--dtype",
    "float32",
]

GUARD = """
def _register_fake_if_defined(name):  # added by tests/sglang_server.py: CPU torch lacks these operators
    namespace, op = name.split("::")
    if hasattr(getattr(torch.ops, namespace), op):
        return torch.library.register_fake(name)
    return lambda fn: fn

"""


def python() -> Path:
    return TARGET / "bin" / "python"


def works() -> bool:
    """Whether the venv's SGLang imports its server and CPU model runner (with the CPU stand-ins)."""
    if not python().exists():
        return False
    probe = "import torchvision.transforms, sglang.srt.entrypoints.http_server, sglang.srt.mem_cache.allocation"
    env = {**os.environ, **CPU_ENV}
    done = subprocess.run([str(python()), "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    return done.returncode == 0


def guard_torchvision(site: Path) -> None:
    """Make the two `register_fake` calls of torchvision/_meta_registrations.py skip operators that
    the CUDA build's C library would define and CPU torch does not have."""
    path = site / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    if "_register_fake_if_defined" in text:
        return
    guarded, n = re.subn(r"@torch\.library\.register_fake\(", "@_register_fake_if_defined(", text)
    if n == 0:
        raise SystemExit(f"{path}: no torch.library.register_fake call to guard; the torchvision guard needs updating")
    head, sep, rest = guarded.partition("\n\n\n")  # after the imports
    path.write_text(head + sep + GUARD.lstrip("\n") + "\n" + rest)


def pip(*args: str) -> None:
    cmd = [str(python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


def install() -> Path:
    if works():
        return python()
    venv.EnvBuilder(with_pip=True, clear=True).create(TARGET)
    pip(TORCH)
    pip("-r", str(REQUIREMENTS), TORCH)
    pip("--no-deps", *NO_DEPS)
    site = next((TARGET / "lib").glob("python3*/site-packages"))
    guard_torchvision(site)
    if not works():
        raise SystemExit(f"SGLang {VERSION} installed in {TARGET}, but its server does not import on CPU")
    return python()


def installed() -> Path:
    """The server venv's python; an AssertionError naming the install command if it is missing."""
    assert python().exists(), (
        f"the real SGLang {VERSION} server is not installed in {TARGET}: run `.venv/bin/python tests/sglang_server.py`"
    )
    return python()


if __name__ == "__main__":
    print(f"SGLang {VERSION} server: {install()}", file=sys.stderr)
