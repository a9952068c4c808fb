"""The pilot: a seeded sample of each category generated on the configured engine, and a projection
of the full run from it, before the GPU bill.

`pilot_generate` (one job per category, on the engine the generate jobs use) sends the sample's
conversations, every turn of them, through the generate job's own code, into the category's
journal directory (`cache/journal/{category}/pilot.jsonl`): the full run reuses every answer. It
records what it measured: requests, output tokens and the client's wall time at the configured
concurrency.

`project_pilot` scales the sample to each category's usable conversations: the mean per
conversation times their number, with a 95 % interval from the sample's spread (normal
approximation with the finite-population correction: the interval is 0 when the sample is the whole
category). GPU-hours are the projected output tokens at the pilot's measured output tokens per
second, times the server's GPUs; disk is the sample's own bytes per conversation (dataset JSONL,
journal, generations Parquet) scaled the same way.
"""

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path

import orjson

from eagle3_datagen.generation.assemble import ASSEMBLE_COLUMNS, sending_job
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.servers import job_facts
from eagle3_datagen.settings import ClientSettings, ModelProfile, server_gpus, stable_hash
from eagle3_datagen.steps.export_dataset import dataset_row
from eagle3_datagen.steps.generate import generate_category
from eagle3_datagen.steps.plan_generation import journal_path
from eagle3_datagen.storage.tables import iter_batches, iter_rows, read_provenance

log = logging.getLogger(__name__)

Z95 = 1.96


def sample_keys(prompts: Path, pilot: dict, seed: int) -> tuple[set, int]:
    """(the sampled (id, sample_index) keys, the category's usable conversations): the
    max(min_rows, ceil(fraction x usable)) usable rows with the smallest seeded hashes."""
    drawn = []
    for rows in iter_batches(prompts, columns=["id", "sample_index", "status"]):
        for r in rows:
            if r["status"] == "ok":
                key = (r["id"], int(r["sample_index"]))
                drawn.append((stable_hash([seed, "pilot", *key]), key))
    n = min(len(drawn), max(int(pilot["min_rows"]), math.ceil(float(pilot["fraction"]) * len(drawn))))
    return {key for _, key in sorted(drawn)[:n]}, len(drawn)


def pilot_journal_path(cache_dir: str | Path, category: str) -> Path:
    return journal_path(cache_dir, category, 0, 1).with_name("pilot.jsonl")


def pilot_journal(cache_dir: str | Path, category: str) -> Journal:
    """The pilot's journal, beside the category's shard journals: each reads the others."""
    path = pilot_journal_path(cache_dir, category)
    others = sorted(path.parent.glob("*.jsonl")) if path.parent.exists() else []
    return Journal(path, also_read=others)


def pilot_generate(
    *,
    prompts: Path,
    pilot_generations: Path,
    pilot_run: Path,
    pilot_server_log: Path,
    category: str,
    model: dict,
    sampling: dict,
    engine: dict,
    budget: dict,
    client: dict,
    cache_dir: str,
    pilot: dict,
    seed: int,
) -> dict:
    """Generate the category's pilot sample (every turn of its conversations) and record what it took."""
    keys, usable = sample_keys(prompts, pilot, seed)
    facts = read_provenance(prompts)

    def prompt_rows() -> Iterator[dict]:
        return (r for r in iter_rows(prompts, columns=ASSEMBLE_COLUMNS) if (r["id"], int(r["sample_index"])) in keys)

    with sending_job(pilot_journal_path(cache_dir, category), pilot_server_log, pilot_generations) as (
        attempt_server_log,
        writer,
    ):
        journal = pilot_journal(cache_dir, category)
        provenance = generate_category(
            prompt_rows,
            facts=facts,
            profile=ModelProfile.from_config(model),
            sampling=sampling,
            engine=engine,
            budget=budget,
            client_settings=ClientSettings.from_config(client),
            journal=journal,
            server_log=attempt_server_log,
            max_failed_share=1.0,  # a pilot reports its failures; it does not stop on them
            category=f"{category} (pilot)",
            writer=writer,
        )
        writer.close({"prompts": facts, "pilot": pilot, **provenance})
    run = {
        "category": category,
        "usable_conversations": usable,
        "sampled": len(keys),
        "pilot": pilot,
        "plan": provenance["plan"],
        "client": provenance.get("client"),
        "engine_kind": engine["kind"],
        "server_gpus": server_gpus(engine),
        "journal": str(journal.path),
        "journal_bytes": journal.path.stat().st_size if journal.path.exists() else 0,
        "job": job_facts(),
    }
    pilot_run.parent.mkdir(parents=True, exist_ok=True)
    pilot_run.write_text(json.dumps(run, indent=2) + "\n")
    log.info("%s pilot: %d of %d conversations, %s", category, len(keys), usable, run["client"])
    return run


# What the projection sums per conversation of the sample.
MEASURES = ("requests", "prompt_tokens", "output_tokens", "truncated", "dataset_bytes", "generations_bytes")


def conversation_measures(path: Path) -> list[dict]:
    """Per sampled conversation: requests (turns sent), prompt and output tokens, turns cut at
    max_new_tokens, and its rows' bytes as dataset JSONL lines."""
    per: dict[tuple, dict] = {}
    for r in iter_rows(path):
        m = per.setdefault((r["id"], r["sample_index"]), dict.fromkeys(MEASURES, 0))
        if r["status"] not in ("ok", "failed"):
            continue
        m["requests"] += 1
        m["prompt_tokens"] += len(r["prompt_ids"])
        m["output_tokens"] += len(r["output_ids"])
        if r["status"] == "ok":
            m["truncated"] += r["finish_type"] == "length"
            m["dataset_bytes"] += len(orjson.dumps(dataset_row(r))) + 1
    size = path.stat().st_size
    for m in per.values():
        m["generations_bytes"] = size / max(len(per), 1)
    return list(per.values())


def project(measures: list[dict], population: int) -> dict:
    """Totals over `population` conversations from a sample of them: (total, 95 % half-width) per measure."""
    n = len(measures)
    out = {}
    for key in MEASURES:
        values = [m[key] for m in measures]
        mean = sum(values) / n if n else 0.0
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        fpc = (population - n) / (population - 1) if population > 1 else 0.0
        half = Z95 * math.sqrt(var / n * max(fpc, 0.0)) * population if n else 0.0
        out[key] = (mean * population, half)
    return out


def projection_row(category: str, measures: list[dict], run: dict) -> dict:
    population, n = run["usable_conversations"], len(measures)
    totals = project(measures, population)
    client = run.get("client") or {}
    rate = client["output_tokens"] / client["elapsed_s"] if client.get("elapsed_s") else None
    tokens, tokens_ci = totals["output_tokens"]
    server_h = tokens / rate / 3600 if rate else None
    gpus = run["server_gpus"]
    journal_per_request = run["journal_bytes"] / max(sum(m["requests"] for m in measures), 1)
    requests = totals["requests"][0]
    dataset = totals["dataset_bytes"][0]
    # The category JSONL and its copy in train.jsonl, the journal, and three Parquet files of about
    # the generations' size (the shards, their merge, the dataset copy).
    disk = 2 * dataset + journal_per_request * requests + 3 * totals["generations_bytes"][0]
    return {
        "category": category,
        "conversations": population,
        "sampled": n,
        "requests": round(requests),
        "requests_ci95": round(totals["requests"][1]),
        "prompt_tokens": round(totals["prompt_tokens"][0]),
        "output_tokens": round(tokens),
        "output_tokens_ci95": round(tokens_ci),
        "truncated_share": round(totals["truncated"][0] / requests, 4) if requests else 0.0,
        "output_tok_per_s": round(rate, 1) if rate else None,
        "concurrency": client.get("concurrency"),
        "server_hours": round(server_h, 4) if server_h is not None else None,
        "server_hours_ci95": round(tokens_ci / rate / 3600, 4) if rate else None,
        "gpu_hours": round(server_h * gpus, 3) if server_h is not None and gpus else None,
        "gpus_per_server": gpus,
        "dataset_gb": round(dataset / 1e9, 4),
        "disk_gb": round(disk / 1e9, 4),
    }


def total_row(rows: list[dict]) -> dict:
    def add(key):
        values = [r[key] for r in rows]
        return None if any(v is None for v in values) else sum(values)

    def add_ci(key):  # independent samples: half-widths add in quadrature
        values = [r[key] for r in rows]
        return None if any(v is None for v in values) else round(math.sqrt(sum(v * v for v in values)), 4)

    total = {"category": "total"}
    for key in ("conversations", "sampled", "requests", "prompt_tokens", "output_tokens", "dataset_gb", "disk_gb"):
        total[key] = add(key)
    for key in ("requests_ci95", "output_tokens_ci95", "server_hours_ci95"):
        total[key] = add_ci(key)
    total["server_hours"] = add("server_hours")
    total["gpu_hours"] = add("gpu_hours")
    truncated = sum(r["truncated_share"] * r["requests"] for r in rows)
    total["truncated_share"] = round(truncated / total["requests"], 4) if total["requests"] else 0.0
    return total


def project_pilot(
    *,
    categories: list[str],
    pilot_generations: list[Path],
    pilot_run: list[Path],
    projection: Path,
    projection_png: Path,
) -> list[dict]:
    """The projection table (per category and in total) and its figure, from every category's pilot."""
    import pandas as pd

    from eagle3_datagen.figures import plot_projection

    rows = []
    for category, gen_path, run_path in zip(categories, pilot_generations, pilot_run):
        rows.append(projection_row(category, conversation_measures(gen_path), json.loads(run_path.read_text())))
    frame = pd.DataFrame(rows + [total_row(rows)])
    projection.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(projection, sep="\t", index=False)
    plot_projection(rows, projection_png)
    log.info("projection of the full run:\n%s", frame.to_string(index=False))
    return rows
