"""The generate step called in-process, as its rule calls it, for the tests that drive it against a
server of their own: the shard's files under a test's folder, a plain run's sampling."""

from pathlib import Path

from eagle3_datagen.settings import defaults
from eagle3_datagen.steps.generate import generate

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def external(url: str) -> dict:
    """The engine config of a server the test started itself."""
    return defaults("engine", kind="external", external={"urls": [url]})


def generate_shard(
    prompts: Path,
    model: dict,
    engine: dict,
    tmp_path: Path,
    *,
    client: dict,
    budget: dict,
    cache_dir: Path | None = None,
    out: Path | None = None,
    shard: int = 0,
    shards: int = 1,
    max_failed_share: float = 0.0,
) -> Path:
    """Generate one shard of category `cat`; returns its generations table."""
    out = out or tmp_path / "results" / "generations" / "cat" / f"shard_{shard}.parquet"
    generate(
        prompts=prompts,
        shard_generations=out,
        server_log=tmp_path / "server.log",
        category="cat",
        shard=shard,
        model=model,
        sampling=SAMPLING,
        engine=engine,
        budget=budget,
        client=client,
        max_failed_share=max_failed_share,
        cache_dir=str(cache_dir or tmp_path / "cache"),
        shards=shards,
    )
    return out
