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

It also reads the quality gate off the sample: each flag's share among the pilot's generated rows
(`quality.flags.row_flags`, with a 95 % Wilson score interval), and the GPU-hours with and without
the live loop stop. Without it a looping answer runs to its `max_new_tokens`; with it, it stops once
the loop is seen: its onset, the tokens a loop of its period must cover, and one streamed chunk
(`quality.stream_interval`). Whichever way the pilot ran, the other way is worked out per row.
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
from eagle3_datagen.quality.flags import CODES, LOOP_FINISH, QualityFacts, QualitySettings, row_flags
from eagle3_datagen.quality.loops import find_loop
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
    quality: dict | None = None,
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
            quality=QualitySettings.from_config(quality),
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
# Output tokens had every loop been stopped live, and had none been: projected as output_tokens is.
LIVE_STOP_MEASURES = ("output_tokens_live_stop", "output_tokens_no_live_stop")
# What the quality columns count over the sample's rows: generated rows, and those flagged per code.
FLAG_COUNTS = ("generated", *(f"flag_{code}" for code in CODES))


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a share of k in n (95 % with the default z); (0, 1) for n = 0.

    Unlike the normal approximation it stays within [0, 1] and is not empty at k = 0 or k = n,
    where a pilot's rare flags usually are."""
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"a share needs 0 <= k <= n, not k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def row_quality(row: dict, facts: QualityFacts, quality: QualitySettings) -> tuple[list[str], int, int]:
    """(the generated row's flag codes, its output tokens with the live loop stop, without it).

    A row the client stopped as a loop (`LOOP_FINISH`) would have run to its max_new_tokens; a row
    that ends in a loop otherwise would have been stopped at the loop's onset, plus the tokens a
    loop of its period must cover, plus one streamed chunk (never more than it has)."""
    output_ids, finish = row["output_ids"], row["finish_type"]
    n = len(output_ids)
    codes = [f.code for f in row_flags(row["prompt_ids"], output_ids, finish, facts, quality.loop)]
    if finish == LOOP_FINISH:
        return codes, n, max(n, int(row["max_new_tokens"] or 0))
    if "repetition_loop" in codes:
        stopped = finish == "stop" and n > 0 and output_ids[-1] in facts.stop_ids
        loop = find_loop(output_ids, quality.loop, end=n - 1 if stopped else n)
        if loop is not None:
            return codes, min(n, loop.start + quality.loop.need(loop.period) + quality.stream_interval), n
    return codes, n, n


def conversation_measures(path: Path, quality: QualitySettings | None = None) -> list[dict]:
    """Per sampled conversation: requests (turns sent), prompt and output tokens, turns cut at
    max_new_tokens, its rows' bytes as dataset JSONL lines, its output tokens with and without the
    live loop stop, and its generated rows, in all and per flag code."""
    quality = quality or QualitySettings()
    facts = QualityFacts.from_token_facts(read_provenance(path)["prompts"])
    per: dict[tuple, dict] = {}
    for r in iter_rows(path):
        m = per.setdefault((r["id"], r["sample_index"]), dict.fromkeys(MEASURES + LIVE_STOP_MEASURES + FLAG_COUNTS, 0))
        if r["status"] not in ("ok", "failed"):
            continue
        m["requests"] += 1
        m["prompt_tokens"] += len(r["prompt_ids"])
        m["output_tokens"] += len(r["output_ids"])
        with_stop = without_stop = len(r["output_ids"])
        if r["status"] == "ok":
            m["truncated"] += r["finish_type"] == "length"
            m["dataset_bytes"] += len(orjson.dumps(dataset_row(r))) + 1
            codes, with_stop, without_stop = row_quality(r, facts, quality)
            m["generated"] += 1
            for code in codes:
                m[f"flag_{code}"] += 1
        m["output_tokens_live_stop"] += with_stop
        m["output_tokens_no_live_stop"] += without_stop
    size = path.stat().st_size
    for m in per.values():
        m["generations_bytes"] = size / max(len(per), 1)
    return list(per.values())


def project(measures: list[dict], population: int, keys: tuple[str, ...] = MEASURES) -> dict:
    """Totals over `population` conversations from a sample of them: (total, 95 % half-width) per measure."""
    n = len(measures)
    out = {}
    for key in keys:
        values = [m[key] for m in measures]
        mean = sum(values) / n if n else 0.0
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        fpc = (population - n) / (population - 1) if population > 1 else 0.0
        half = Z95 * math.sqrt(var / n * max(fpc, 0.0)) * population if n else 0.0
        out[key] = (mean * population, half)
    return out


def flag_columns(counts: dict) -> dict:
    """Per flag code: its rows among the pilot's generated rows, their share and its 95 % Wilson interval."""
    n = int(counts["generated"])
    out: dict = {"pilot_rows": n}
    for code in CODES:
        k = int(counts[f"flag_{code}"])
        low, high = wilson_interval(k, n)
        out[f"{code}_rows"] = k
        out[f"{code}_share"] = round(k / n, 4) if n else None
        out[f"{code}_low"] = round(low, 4)
        out[f"{code}_high"] = round(high, 4)
    return out


def live_stop_columns(totals: dict, rate: float | None, gpus: int | None) -> dict:
    """Output tokens, server-hours and GPU-hours with and without the live loop stop, turned into
    hours as the projection's own output tokens are (at the pilot's measured rate, times the GPUs)."""
    out: dict = {}
    for key, suffix in zip(LIVE_STOP_MEASURES, ("live_stop", "no_live_stop")):
        tokens = totals[key][0]
        server_h = tokens / rate / 3600 if rate else None
        out[f"output_tokens_{suffix}"] = round(tokens)
        out[f"server_hours_{suffix}"] = round(server_h, 4) if server_h is not None else None
        out[f"gpu_hours_{suffix}"] = round(server_h * gpus, 3) if server_h is not None and gpus else None
    return out


def projection_row(category: str, measures: list[dict], run: dict) -> dict:
    population, n = run["usable_conversations"], len(measures)
    totals = project(measures, population, MEASURES + LIVE_STOP_MEASURES)
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
        **live_stop_columns(totals, rate, gpus),
        **flag_columns({key: sum(m[key] for m in measures) for key in FLAG_COUNTS}),
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
    for suffix in ("live_stop", "no_live_stop"):
        for key in (f"output_tokens_{suffix}", f"server_hours_{suffix}", f"gpu_hours_{suffix}"):
            total[key] = add(key)
    # The flags' shares over every pilot row (the samples pooled).
    pooled = {"generated": sum(r["pilot_rows"] for r in rows)}
    pooled |= {f"flag_{code}": sum(r[f"{code}_rows"] for r in rows) for code in CODES}
    return total | flag_columns(pooled)


def log_flags(row: dict) -> None:
    """One line per category: each flag's rows among the pilot's generated rows, share and interval."""
    parts = [
        f"{code} {row[f'{code}_rows']} ({100 * (row[f'{code}_share'] or 0.0):.1f} %, "
        f"95 % {100 * row[f'{code}_low']:.1f}-{100 * row[f'{code}_high']:.1f} %)"
        for code in CODES
    ]
    log.info("%s quality flags among %d pilot rows: %s", row["category"], row["pilot_rows"], ", ".join(parts))


def project_pilot(
    *,
    categories: list[str],
    pilot_generations: list[Path],
    pilot_run: list[Path],
    projection: Path,
    projection_png: Path,
    quality: dict | None = None,
) -> list[dict]:
    """The projection table (per category and in total) and its figure, from every category's pilot."""
    import pandas as pd

    from eagle3_datagen.figures import plot_projection

    settings = QualitySettings.from_config(quality)
    rows = []
    for category, gen_path, run_path in zip(categories, pilot_generations, pilot_run):
        measures = conversation_measures(gen_path, settings)
        rows.append(projection_row(category, measures, json.loads(run_path.read_text())))
    total = total_row(rows)
    frame = pd.DataFrame(rows + [total])
    projection.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(projection, sep="\t", index=False)
    plot_projection(rows, projection_png)
    log.info("projection of the full run:\n%s", frame.to_string(index=False))
    for row in [*rows, total]:
        log_flags(row)
    log.info(
        "in total, with the live loop stop and without it: %s and %s output tokens, %s and %s server-hours, "
        "%s and %s GPU-hours (the full run %s loops live: quality.live_stop and the repetition_loop policy)",
        *(
            total[f"{key}_{s}"]
            for key in ("output_tokens", "server_hours", "gpu_hours")
            for s in ("live_stop", "no_live_stop")
        ),
        "stops" if settings.stops_loops_live else "does not stop",
    )
    return rows
