"""plan_generation: which rows of a shard need the server (`generation.planning`), before any server
starts; the plans size the generate jobs and make the cost preview (preview_generation: results/plan.tsv).
"""

import json
import logging
from pathlib import Path

from eagle3_datagen.generation.journal import loop_rows
from eagle3_datagen.generation.planning import PLAN_COLUMNS, make_builder, make_plan, open_journal, shard_rows
from eagle3_datagen.quality.flags import QualitySettings
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.storage.tables import Batching, iter_rows, read_provenance

log = logging.getLogger(__name__)


def plan_generation(
    *,
    prompts: Path,
    plan: Path,
    category: str,
    shard: int,
    model: dict,
    sampling: dict,
    engine: dict,
    cache_dir: str,
    shards: int,
    budget: dict,
    batch: dict | None = None,
    quality: dict | None = None,
) -> dict:
    """Write the plan of one shard: turns to send, already generated, skipped (no server; the
    tokenizer only to follow conversations whose earlier turns the journal holds). A journalled row
    stopped as a loop counts as generated only where `quality` would stop it again (`loop_rows`)."""
    builder = make_builder(read_provenance(prompts), ModelProfile.from_config(model), sampling, engine, budget)
    settings = QualitySettings.from_config(quality)
    with open_journal(cache_dir, category, shard, shards, read_only=True) as journal:
        journal.reuse = loop_rows(settings.loop if settings.stops_loops_live else None)
        rows = iter_rows(prompts, Batching.from_config(batch), columns=PLAN_COLUMNS)
        summary = {
            "category": category,
            "shard": shard,
            "shards": shards,
            **make_plan(shard_rows(rows, shard, shards), builder, journal).summary(),
        }
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s", summary)
    return summary


def preview_generation(*, plan: list[Path], preview: Path) -> None:
    """Collect every shard's plan into one table: the cost preview, before any GPU time is spent."""
    import pandas as pd

    # A shard's per-mode counts become columns (by_mode.<mode>.max_new_tokens_to_send, ...).
    frame = pd.json_normalize([json.loads(p.read_text()) for p in plan])
    preview.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(preview, sep="\t", index=False)
    log.info("generation preview:\n%s", frame.to_string(index=False))
