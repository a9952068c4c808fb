"""How the server carried each category: retractions, prefix-cache hits, time queued, requests in flight.

From each answered row's `num_retractions`, `cached_tokens` and `queue_time` (as SGLang reports them),
and the client's timeline in the generate jobs' provenance. Rule plot_load writes the table and figure.
"""

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from eagle3_datagen.figures.base import save
from eagle3_datagen.figures.load import draw_load
from eagle3_datagen.storage.tables import DEFAULT_BATCHING, Batching, iter_record_batches, read_provenance

log = logging.getLogger(__name__)

LOAD_COLUMNS = ["status", "prompt_ids", "cached_tokens", "num_retractions", "queue_time"]


def category_load(category: str, generations: str | Path, batching: Batching = DEFAULT_BATCHING) -> tuple[dict, list]:
    """(the category's load row, its generate jobs' timelines as (label, columns)), streamed."""
    answered = retracted_rows = retractions = prompt_tokens = cached = 0
    queue: list[np.ndarray] = []
    for batch in iter_record_batches(generations, batching, columns=LOAD_COLUMNS):
        ok = pc.equal(batch["status"], "ok")
        batch = batch.filter(ok)
        if not batch.num_rows:
            continue
        answered += batch.num_rows
        n_retract = batch["num_retractions"].fill_null(0).to_numpy(zero_copy_only=False)
        retractions += int(n_retract.sum())
        retracted_rows += int((n_retract > 0).sum())
        prompt_tokens += int(pc.sum(pc.list_value_length(batch["prompt_ids"])).as_py() or 0)
        cached += int(pc.sum(batch["cached_tokens"].fill_null(0)).as_py() or 0)
        queue.append(batch["queue_time"].fill_null(0.0).to_numpy(zero_copy_only=False))
    queued = np.concatenate(queue) if queue else np.zeros(0)
    reported = bool(queued.size and (queued > 0).any())  # SGLang reports it only with --enable-metrics
    provenance = read_provenance(generations)
    shards = provenance.get("shards") or [provenance]
    clients = [(n, s["client"]) for n, s in enumerate(shards) if s.get("client")]
    timelines = [
        (category if len(shards) == 1 else f"{category}[{n}]", c["timeline"]) for n, c in clients if c.get("timeline")
    ]
    settings = sorted({str(c.get("concurrency")) for _, c in clients})
    means = [c["limit_mean"] for _, c in clients if c.get("limit_mean") is not None]
    row = {
        "category": category,
        "answered": answered,
        "retractions": retractions,
        "rows_retracted": retracted_rows,
        "retractions_per_1000": round(1000 * retractions / answered, 2) if answered else 0.0,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "cache_hit_share": round(cached / prompt_tokens, 4) if prompt_tokens else 0.0,
        "queue_time_mean_s": round(float(queued.mean()), 4) if reported else None,
        "queue_time_p90_s": round(float(np.quantile(queued, 0.9)), 4) if reported else None,
        "concurrency": ",".join(settings) if settings else "",
        "limit_mean": round(sum(means) / len(means), 1) if means else None,
        "limit_max": max((c.get("limit_max") or 0 for _, c in clients), default=None) if clients else None,
        "requests_per_s": round(sum(c.get("requests_per_s", 0.0) for _, c in clients), 3) if clients else None,
        "load_endpoint": ",".join(sorted({e for _, c in clients for e in c.get("load_endpoint", [])})),
    }
    return row, timelines


def plot_load(
    *,
    categories: list[str],
    generations: list[Path],
    load_summary: Path,
    load_png: Path,
    batch: dict | None = None,
) -> pd.DataFrame:
    """The load table (one row per category) and its figure."""
    batching = Batching.from_config(batch)
    rows, timelines = [], {}
    for category, path in zip(categories, generations):
        row, timelines[category] = category_load(category, path, batching)
        rows.append(row)
    frame = pd.DataFrame(rows)
    Path(load_summary).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(load_summary, sep="\t", index=False)
    save(draw_load(frame, timelines), Path(load_png))
    log.info("load per category:\n%s", frame.to_string(index=False))
    return frame
