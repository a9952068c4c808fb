"""The pilot (docs/running.md): a seeded sample of each category generated on the configured engine
into the category's journal (the full run reuses every answer), and the projection of the full run
from it, per serving mode (`generation.projection`), before the GPU bill.
"""

import json
import logging
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation.assemble import ASSEMBLE_COLUMNS, sending_job
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.projection import FLAG_COUNTS, LIVE_STOP_MEASURES, MEASURES, category_rows, total_rows
from eagle3_datagen.generation.run import generate_category
from eagle3_datagen.generation.servers import job_facts
from eagle3_datagen.quality.flags import CODES, LOOP_FINISH, QualityFacts, QualitySettings, row_flags
from eagle3_datagen.quality.loops import find_loop
from eagle3_datagen.settings import ALL_MODES, DEFAULT_MODE, ClientSettings, ModelProfile, PilotSettings, stable_hash
from eagle3_datagen.storage.layout import journal_path
from eagle3_datagen.storage.tables import iter_rows, read_provenance
from eagle3_datagen.storage.trainer_rows import dataset_row

log = logging.getLogger(__name__)


def sample_keys(prompts: Path, pilot: dict, seed: int, order: tuple[str, ...] = ()) -> tuple[set, dict[str, int]]:
    """(the sampled (id, sample_index, mode) keys, usable conversations per mode, `order` first): per
    mode, the max(min_rows, ceil(fraction x usable)) usable rows with the smallest seeded hashes."""
    settings = PilotSettings.from_config(pilot)
    drawn: dict[str, list] = {}
    for r in iter_rows(prompts, columns=["id", "sample_index", "mode", "status"]):
        if r["status"] == "ok":
            key = (r["id"], int(r["sample_index"]), r["mode"])
            # A profile's one default mode draws as before modes were: the same sample.
            hashed = key[:2] if r["mode"] == DEFAULT_MODE else key
            drawn.setdefault(r["mode"] or DEFAULT_MODE, []).append((stable_hash([seed, "pilot", *hashed]), key))
    keys = set()
    for in_mode in drawn.values():
        n = min(len(in_mode), max(settings.min_rows, math.ceil(settings.fraction * len(in_mode))))
        keys |= {key for _, key in sorted(in_mode)[:n]}
    return keys, {mode: len(drawn[mode]) for mode in dict.fromkeys([*order, *drawn]) if drawn.get(mode)}


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
    profile = ModelProfile.from_config(model)
    keys, by_mode = sample_keys(prompts, pilot, seed, profile.mode_names)
    usable = sum(by_mode.values())
    sampled = Counter(key[2] or DEFAULT_MODE for key in keys)
    facts = read_provenance(prompts)

    def prompt_rows() -> Iterator[dict]:
        return (
            r
            for r in iter_rows(prompts, columns=ASSEMBLE_COLUMNS)
            if (r["id"], int(r["sample_index"]), r["mode"]) in keys
        )

    path = journal_path(cache_dir, category, 0, 1).with_name("pilot.jsonl")
    with sending_job(path, pilot_server_log, pilot_generations) as (attempt_server_log, writer):
        # Beside the category's shard journals: each reads the others.
        journal = Journal(path, also_read=sorted(path.parent.glob("*.jsonl")) if path.parent.exists() else [])
        provenance = generate_category(
            prompt_rows,
            facts=facts,
            profile=profile,
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
    server = EngineSettings.from_config(engine)
    run = {
        "category": category,
        "usable_conversations": usable,
        "usable_by_mode": by_mode,
        "sampled": len(keys),
        "sampled_by_mode": {mode: sampled[mode] for mode in by_mode if sampled[mode]},
        "pilot": pilot,
        "plan": provenance["plan"],
        "budget": budget,
        "client": provenance.get("client"),
        "engine_kind": server.kind,
        "server_gpus": server.all_gpus,
        "journal": str(journal.path),
        "journal_bytes": journal.path.stat().st_size if journal.path.exists() else 0,
        "job": job_facts(),
    }
    pilot_run.parent.mkdir(parents=True, exist_ok=True)
    pilot_run.write_text(json.dumps(run, indent=2) + "\n")
    per_mode = ", ".join(f"{mode} {sampled[mode]} of {n}" for mode, n in by_mode.items())
    several = f" ({per_mode})" if len(by_mode) > 1 else ""
    log.info("%s pilot: %d of %d conversations%s, %s", category, len(keys), usable, several, run["client"])
    return run


def row_quality(row: dict, facts: QualityFacts, quality: QualitySettings) -> tuple[list[str], int, int]:
    """(the generated row's flag codes, its output tokens with the live loop stop, without it): the
    stop cuts a loop at its onset plus the tokens its period must cover plus one streamed chunk."""
    output_ids, finish = row["output_ids"], row["finish_type"]
    n = len(output_ids)
    codes = [f.code for f in row_flags(row["prompt_ids"], output_ids, finish, facts, quality.loop)]
    if finish == LOOP_FINISH:
        return codes, n, max(n, int(row["max_new_tokens"] or 0))
    if "repetition_loop" in codes:
        stopped = finish == "stop" and n > 0 and output_ids[-1] in facts.stop_ids
        loop = find_loop(output_ids, quality.loop, end=n - 1 if stopped else n, at_budget=finish == "length")
        if loop is not None:
            return codes, min(n, loop.start + quality.loop.need(loop.period) + quality.stream_interval), n
    return codes, n, n


# What conversation_measures counts per conversation.
COUNTED = MEASURES + LIVE_STOP_MEASURES + FLAG_COUNTS


def conversation_measures(path: Path, quality: QualitySettings) -> list[dict]:
    """Per sampled conversation, its `mode` and `COUNTED`: requests, tokens, truncation, bytes, output
    tokens with and without the live loop stop, generated rows in all and per flag code."""
    facts = QualityFacts.from_token_facts(read_provenance(path)["prompts"])
    per: dict[tuple, dict] = {}
    for r in iter_rows(path):
        mode = r["mode"] or DEFAULT_MODE
        m = per.setdefault((r["id"], r["sample_index"], mode), {"mode": mode, **dict.fromkeys(COUNTED, 0)})
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


def log_flags(row: dict, label: str) -> None:
    """One line per projection row: each flag's rows among the pilot's generated rows, share and interval."""
    parts = [
        f"{code} {row[f'{code}_rows']} ({100 * (row[f'{code}_share'] or 0.0):.1f} %, "
        f"95 % {100 * row[f'{code}_low']:.1f}-{100 * row[f'{code}_high']:.1f} %)"
        for code in CODES
    ]
    log.info("%s quality flags among %d pilot rows: %s", label, row["pilot_rows"], ", ".join(parts))


def log_cost(row: dict, label: str) -> None:
    """What a total's conversations cost, in all and per conversation: requests, tokens, hours."""
    n = max(int(row["conversations"]), 1)
    key, unit = ("gpu_hours", "GPU-hours") if row["gpu_hours"] is not None else ("server_hours", "server-hours")
    log.info(
        "%s: %d conversations, %d requests (%.2f a conversation), %d prompt tokens (%.0f a conversation), "
        "%d output tokens (%.0f a conversation), %s %s",
        label,
        row["conversations"],
        *(value for k in ("requests", "prompt_tokens", "output_tokens") for value in (row[k], row[k] / n)),
        row[key],
        unit,
    )


def project_pilot(
    *,
    categories: list[str],
    pilot_generations: list[Path],
    pilot_run: list[Path],
    projection: Path,
    projection_png: Path,
    quality: dict | None = None,
) -> list[dict]:
    """The projection table (per category and mode, and in total) and its figure, from every category's
    pilot; returns the categories' rows (without the totals)."""
    import pandas as pd

    from eagle3_datagen.figures.base import save, series_name
    from eagle3_datagen.figures.projection import draw_projection

    settings = QualitySettings.from_config(quality)
    rows = []
    for category, gen_path, run_path in zip(categories, pilot_generations, pilot_run):
        rows += category_rows(category, conversation_measures(gen_path, settings), json.loads(run_path.read_text()))
    totals = total_rows(rows)
    total = totals[-1]
    frame = pd.DataFrame(rows + totals)
    projection.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(projection, sep="\t", index=False)
    per_mode = [r for r in rows if r["mode"] != ALL_MODES]
    several = len({r["mode"] for r in per_mode}) > 1
    labels = [series_name(r["category"], r["mode"], several) for r in rows + totals]
    save(draw_projection(per_mode, [series_name(r["category"], r["mode"], several) for r in per_mode]), projection_png)
    log.info("projection of the full run:\n%s", frame.to_string(index=False))
    for row, label in zip(rows + totals, labels):
        log_flags(row, label)
    if several:  # what each mode costs, against the whole run
        for row, label in zip(totals, labels[len(rows) :]):
            log_cost(row, label)
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
