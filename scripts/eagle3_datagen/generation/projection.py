"""The pilot's projection table: the projected cost of the full run per category and serving mode,
from the measures of each sampled conversation (`pilot.conversation_measures`) and each category's
pilot run record.

Each mode's usable conversations are projected from the pilot's of that mode (mean times number,
95 % interval: normal approximation with the finite-population correction); rows over several
(mode `all`, the totals) sum them, half-widths in quadrature. Hours are output tokens at the
category pilot's measured rate (its modes were generated together), times the server's GPUs.
"""

import logging
import math

from eagle3_datagen.quality.flags import CODES
from eagle3_datagen.settings import ALL_MODES, DEFAULT_MODE, Budget, mode_totals

log = logging.getLogger(__name__)

Z95 = 1.96
# What the projection sums per conversation of the sample.
MEASURES = ("requests", "prompt_tokens", "output_tokens", "truncated", "dataset_bytes", "generations_bytes")
# Output tokens had every loop been stopped live, and had none been: projected as output_tokens is.
LIVE_STOP_MEASURES = ("output_tokens_live_stop", "output_tokens_no_live_stop")
# What the quality columns count over the sample's rows: generated rows, and those flagged per code.
FLAG_COUNTS = ("generated", *(f"flag_{code}" for code in CODES))
# The decimals of the projection's floats: hours and gigabytes (the rest are whole numbers).
DIGITS = {"server": 4, "gpu": 3, "dataset": 4, "disk": 4}
# Values that a row over several rows keeps only where they all share it.
SHARED = ("max_new_tokens", "output_tok_per_s", "concurrency", "gpus_per_server")


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


def hours(tokens: float, rate: float | None, gpus: int | None) -> tuple[float | None, float | None]:
    """Server-hours and GPU-hours of `tokens` output tokens at `rate` a second on `gpus` GPUs (None: unknown)."""
    if not rate:
        return None, None
    server_h = tokens / rate / 3600
    return round(server_h, 4), (round(server_h * gpus, 3) if gpus else None)


def live_stop_columns(totals: dict, rate: float | None, gpus: int | None) -> dict:
    """Output tokens, server-hours and GPU-hours with and without the live loop stop."""
    out: dict = {}
    for key, suffix in zip(LIVE_STOP_MEASURES, ("live_stop", "no_live_stop")):
        out[f"output_tokens_{suffix}"] = round(totals[key][0])
        out[f"server_hours_{suffix}"], out[f"gpu_hours_{suffix}"] = hours(totals[key][0], rate, gpus)
    return out


def projection_row(
    category: str, measures: list[dict], run: dict, *, mode: str, population: int, journal_per_request: float
) -> dict:
    """One mode of a category: its projection over `population` conversations from the pilot's
    `measures` of them; `journal_per_request` sizes the full run's journal."""
    n = len(measures)
    totals = project(measures, population, MEASURES + LIVE_STOP_MEASURES)
    client = run.get("client") or {}
    rate = client["output_tokens"] / client["elapsed_s"] if client.get("elapsed_s") else None
    tokens, tokens_ci = totals["output_tokens"]
    gpus = run["server_gpus"]
    server_h, gpu_h = hours(tokens, rate, gpus)
    requests = totals["requests"][0]
    dataset = totals["dataset_bytes"][0]
    # The category JSONL and its copy in train.jsonl, the journal, and three Parquet files of about
    # the generations' size (the shards, their merge, the dataset copy).
    disk = 2 * dataset + journal_per_request * requests + 3 * totals["generations_bytes"][0]
    return {
        "category": category,
        "mode": mode,
        "conversations": population,
        "sampled": n,
        "requests": round(requests),
        "requests_ci95": round(totals["requests"][1]),
        "prompt_tokens": round(totals["prompt_tokens"][0]),
        "output_tokens": round(tokens),
        "output_tokens_ci95": round(tokens_ci),
        "truncated_share": round(totals["truncated"][0] / requests, 4) if requests else 0.0,
        # The mode's budget, as the pilot run record has it (a record from before budgets per mode: none).
        "max_new_tokens": Budget(**run["budget"]).for_mode(mode).max_new_tokens if run.get("budget") else None,
        "output_tok_per_s": round(rate, 1) if rate else None,
        "concurrency": client.get("concurrency"),
        "server_hours": server_h,
        "server_hours_ci95": round(tokens_ci / rate / 3600, 4) if rate else None,
        "gpu_hours": gpu_h,
        "gpus_per_server": gpus,
        "dataset_gb": round(dataset / 1e9, 4),
        "disk_gb": round(disk / 1e9, 4),
        **live_stop_columns(totals, rate, gpus),
        **flag_columns({key: sum(m[key] for m in measures) for key in FLAG_COUNTS}),
    }


def total_row(rows: list[dict], category: str, mode: str) -> dict:
    """The sum of projection rows that do not overlap (independent samples: the intervals' half-widths
    add in quadrature), named (`category`, `mode`)."""

    def add(key):  # rounded as the rows are: a sum of floats carries their representation error
        values = [r[key] for r in rows]
        return None if any(v is None for v in values) else round(sum(values), DIGITS.get(key.split("_")[0], 0))

    def add_ci(key):  # counts to whole numbers, as the rows' are; hours to 4 decimals
        values = [r[key] for r in rows]
        if any(v is None for v in values):
            return None
        half = math.sqrt(sum(v * v for v in values))
        return round(half, 4) if key.startswith("server_hours") else round(half)

    total = {"category": category, "mode": mode}
    total |= {k: add(k) for k in ("conversations", "sampled", "requests", "prompt_tokens", "output_tokens")}
    total |= {k: add(k) for k in ("dataset_gb", "disk_gb")}
    total |= {k: add_ci(k) for k in ("requests_ci95", "output_tokens_ci95", "server_hours_ci95")}
    total |= {k: add(k) for k in ("server_hours", "gpu_hours")}
    truncated = sum(r["truncated_share"] * r["requests"] for r in rows)
    total["truncated_share"] = round(truncated / total["requests"], 4) if total["requests"] else 0.0
    for key in SHARED:
        values = {r.get(key) for r in rows}
        total[key] = values.pop() if len(values) == 1 else None
    for suffix in ("live_stop", "no_live_stop"):
        total |= {f"{k}_{suffix}": add(f"{k}_{suffix}") for k in ("output_tokens", "server_hours", "gpu_hours")}
    # The flags' shares over every pilot row (the samples pooled).
    pooled = {"generated": sum(r["pilot_rows"] for r in rows)}
    pooled |= {f"flag_{code}": sum(r[f"{code}_rows"] for r in rows) for code in CODES}
    return total | flag_columns(pooled)


def mode_populations(category: str, measures: list[dict], run: dict) -> dict[str, int]:
    """{mode: usable conversations} of a category, as its pilot run recorded them (`usable_by_mode`;
    a record without it is of one mode, the pilot rows')."""
    by_mode = run.get("usable_by_mode")
    if by_mode is None:
        modes = list(dict.fromkeys(m["mode"] for m in measures))
        if len(modes) > 1:
            raise ValueError(f"{category}: the pilot run record has no usable_by_mode, yet its rows have modes {modes}")
        by_mode = {modes[0] if modes else DEFAULT_MODE: run["usable_conversations"]}
    populations = {str(mode): int(n) for mode, n in by_mode.items() if n}
    stray = sorted({m["mode"] for m in measures} - set(populations))
    if stray:
        raise ValueError(f"{category}: pilot rows of mode(s) {stray}, of which its prompts table has no usable rows")
    return populations


def category_rows(category: str, measures: list[dict], run: dict) -> list[dict]:
    """A category's projection rows: one per mode it has, then (several modes) their sum, mode `all`.

    A mode whose usable conversations the pilot drew none of is projected from the category's whole
    sample (its `sampled` is 0 and its flags are unknown), with a warning."""
    # The pilot's journal holds every mode's requests: its bytes per request are the category's.
    journal_per_request = run["journal_bytes"] / max(sum(m["requests"] for m in measures), 1)
    rows = []
    for mode, population in mode_populations(category, measures, run).items():
        sample = [m for m in measures if m["mode"] == mode]
        row = projection_row(
            category,
            sample or measures,
            run,
            mode=mode,
            population=population,
            journal_per_request=journal_per_request,
        )
        if not sample:
            log.warning(
                "%s: the pilot drew none of the %d usable conversations of mode %s; they are projected "
                "from the category's whole sample (raise pilot.min_rows or pilot.fraction to measure them)",
                category,
                population,
                mode,
            )
            row |= {"sampled": 0, **flag_columns(dict.fromkeys(FLAG_COUNTS, 0))}
        rows.append(row)
    if len(rows) > 1:
        rows.append(total_row(rows, category, ALL_MODES))
    return rows


def total_rows(rows: list[dict]) -> list[dict]:
    """The totals under the categories' rows: one per mode where the run has several, then the one over
    every category (mode `all` where the run has several modes, else its one mode)."""
    leaves = [r for r in rows if r["mode"] != ALL_MODES]
    separate, overall = mode_totals(list(dict.fromkeys(r["mode"] for r in leaves)))
    totals = [total_row([r for r in leaves if r["mode"] == mode], "total", mode) for mode in separate]
    totals.append(total_row(leaves, "total", overall))
    return totals
