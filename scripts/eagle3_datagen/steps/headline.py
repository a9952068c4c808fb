"""The run's headline: what it produced, as the first thing the report shows.

Rows kept and left out, tokens and truncation (the summary table), parser-check verdicts, the generate
jobs' hours and GPU-hours and, when a pilot ran, its projection: per category and serving mode. Rule
headline writes it as an HTML fragment for the report's landing page; `headline_values` is the same as data.
"""

import html
import logging
import math
from pathlib import Path

import orjson
import pandas as pd

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.quality.flags import CODES
from eagle3_datagen.settings import ALL_MODES
from eagle3_datagen.storage.tables import read_provenance

log = logging.getLogger(__name__)

TOTAL = "total"  # the summary's and the projection's category of their total rows
LEFT_OUT = ("skipped", "failed", "filtered")
HEADLINE_ID = "run-headline"  # the fragment's element id: the report's landing page styles by it


def count(n: int) -> str:
    """A count as the headline writes it: 12,345."""
    return f"{int(n):,}"


def percent(share: float | None) -> str:
    """A share as the headline writes it: 3.1 % (a dash where there is none)."""
    return "–" if share is None else f"{100 * share:.1f} %"


def hours(h: float | None) -> str:
    """Hours to three significant digits, without an exponent: 1,234, 12.5, 0.0341, 0.0000350."""
    if h is None:
        return "–"
    if h == 0:
        return "0"
    rounded = float(f"{h:.3g}")  # rounded first: 99.96 is 100, not 100.0
    if rounded >= 100:
        return f"{h:,.0f}"
    return f"{rounded:.{2 - math.floor(math.log10(rounded))}f}"


def label(name: str) -> str:
    """A code or verdict as words: reasoning_dropped_by_template -> reasoning dropped by template."""
    return name.replace("_", " ")


def read_table(path: str | Path) -> list[dict]:
    """A TSV's rows as dicts (empty cells as None)."""
    frame = pd.read_csv(path, sep="\t", keep_default_na=False, na_values=[""], dtype={"category": str, "mode": str})
    return [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in frame.to_dict("records")]


def job_usage(provenance: dict) -> dict:
    """Hours of a category's generate jobs that sent requests (each one's whole time with its server,
    `job.wall_s`), and GPU-hours: each job's hours times the GPUs it held."""
    job_h = gpu_h = 0.0
    kinds = set()
    for shard in provenance.get("shards") or [provenance]:
        client = shard.get("client") or {}
        engine = (shard.get("params") or {}).get("engine") or {}
        settings = EngineSettings.from_config(engine) if engine else None
        if settings:
            kinds.add(settings.kind)
        if not client.get("requests"):
            continue  # nothing sent: no server was started (rule generate_cached), no GPU held
        elapsed_h = float(shard["job"]["wall_s"]) / 3600
        job_h += elapsed_h
        gpu_h += elapsed_h * (settings.all_gpus if settings else 0)
    return {"job_hours": job_h, "gpu_hours": gpu_h, "engines": sorted(kinds)}


def verdict_counts(checks: dict, mode: str | None) -> dict[str, int] | None:
    """The parser-check verdicts of a category's rows of one mode (None: all its rows), without the total;
    None where the counts do not say."""
    counts = checks.get("verdicts") if mode is None else (checks.get("verdicts_by_mode") or {}).get(mode)
    return None if counts is None else {k: int(v) for k, v in counts.items() if k != "total"}


def add_counts(parts: list[dict[str, int] | None]) -> dict[str, int] | None:
    if not parts or any(p is None for p in parts):
        return None
    return {k: sum(p.get(k, 0) for p in parts) for k in dict.fromkeys(k for p in parts for k in p)}


def _row_values(row: dict) -> dict:
    """The counts of one summary row that the headline shows."""
    filtered_by = {code: int(row.get(f"quarantined_{code}") or 0) for code in CODES}
    return {
        "rows": int(row["rows"]),
        "kept": int(row["ok"]),
        **{reason: int(row[reason]) for reason in LEFT_OUT},
        "filtered_by": {code: n for code, n in filtered_by.items() if n},
        "prompt_tokens": int(row["prompt_tokens"]),
        "output_tokens": int(row["output_tokens"]),
        "truncated_share": float(row["truncated_share"]),
    }


def _structure(summary: list[dict]) -> tuple[dict[str, list[str]], str, list[str]]:
    """({category: its modes}, the overall total's mode, the modes totalled on their own) of a summary."""
    modes: dict[str, list[str]] = {}
    total_modes = []
    for row in summary:
        if row["category"] == TOTAL:
            total_modes.append(row["mode"])
        elif row["mode"] != ALL_MODES:
            modes.setdefault(row["category"], []).append(row["mode"])
    overall = total_modes[-1] if total_modes else ALL_MODES
    return modes, overall, total_modes[:-1]


def headline_values(
    summary: list[dict], checks: dict[str, dict], usage: dict[str, dict], projection: list[dict] | None = None
) -> dict:
    """The headline as data: `rows` (per category, its modes, then the totals), each with its counts,
    parser-check verdicts and, on whole rows, hours used and projected; `total`, the overall row."""
    by_key = {(r["category"], r["mode"]): r for r in summary}
    projected = {(r["category"], r["mode"]): r for r in projection or []}
    modes, overall, mode_totals = _structure(summary)
    key = "gpu_hours" if (projected.get((TOTAL, overall)) or {}).get("gpu_hours") is not None else "server_hours"
    several_modes = len({m for ms in modes.values() for m in ms} | set(mode_totals)) > 1
    out = []
    for category, its_modes in modes.items():
        whole_mode = ALL_MODES if len(its_modes) > 1 else its_modes[0]
        keys = [(whole_mode, None)] + ([(m, m) for m in its_modes] if len(its_modes) > 1 else [])
        for mode, check_mode in keys:
            row = {"category": category, "mode": mode, "whole": mode == whole_mode}
            row |= _row_values(by_key[(category, mode)])
            row["verdicts"] = verdict_counts(checks.get(category) or {}, check_mode)
            if row["whole"]:
                row |= _hours(usage.get(category), projected.get((category, mode)), key)
            out.append(row)
    total = {"category": TOTAL, "mode": overall, "whole": True} | _row_values(by_key[(TOTAL, overall)])
    total["verdicts"] = add_counts([r["verdicts"] for r in out if r["whole"]])
    used = [usage[c] for c in modes if c in usage]
    summed = {k: sum(u[k] for u in used) for k in ("job_hours", "gpu_hours")} if used else None
    total |= _hours(summed, projected.get((TOTAL, overall)), key)
    rows = [*out, total]
    for mode in mode_totals:
        row = {"category": TOTAL, "mode": mode, "whole": False} | _row_values(by_key[(TOTAL, mode)])
        row["verdicts"] = add_counts(
            [verdict_counts(checks.get(c) or {}, mode) for c, ms in modes.items() if mode in ms]
        )
        rows.append(row)
    engines = sorted({e for u in used for e in u["engines"]})
    parsers = sorted({c.get("reasoning_parser") for c in checks.values() if c.get("reasoning_parser")})
    return {"rows": rows, "total": total, "several_modes": several_modes, "engines": engines, "parsers": parsers}


# The projection's hours: GPU-hours where it knows the server's GPUs, else server-hours.
PROJECTED_UNITS = {"gpu_hours": "GPU-hours", "server_hours": "server-hours"}


def _hours(usage: dict | None, projected: dict | None, key: str) -> dict:
    """A whole row's hours: used (its generate jobs'), and projected (`key` of its projection row)."""
    out = {"job_hours": None, "gpu_hours": None, "projected_hours": None, "projected_unit": None}
    if usage is not None:
        out["job_hours"], out["gpu_hours"] = usage["job_hours"], usage["gpu_hours"]
    if projected is not None and projected.get(key) is not None:
        out["projected_hours"], out["projected_unit"] = float(projected[key]), PROJECTED_UNITS[key]
    return out


def compute_text(total: dict, engines: list[str]) -> str:
    """The hours the run used (and the pilot's projection of them), as the headline says it."""
    if total["job_hours"] is None:
        used = "<strong>no generate job's hours recorded</strong>"
    else:
        job = f"the generate jobs that sent requests ran {hours(total['job_hours'])} job-hours"
        if total["gpu_hours"] == 0 and engines == ["local"]:
            used = f"<strong>0 GPU-hours</strong> (CPU engine); {job}"
        elif total["gpu_hours"] == 0 and "external" in engines:
            used = f"<strong>GPU-hours not counted</strong> (external servers hold their own GPUs); {job}"
        else:
            used = f"<strong>{hours(total['gpu_hours'])} GPU-hours</strong> (each job's time with its server × the GPUs it held); {job}"
    if total["projected_hours"] is not None:
        used += f"; the pilot projected {hours(total['projected_hours'])} {total['projected_unit']} for the full run"
    return used


def verdict_mix(verdicts: dict[str, int] | None) -> str:
    """The verdicts that occur, most first: "reasoning dropped by template 95.0 % (142), exact 5.0 % (7)"."""
    n = sum((verdicts or {}).values())
    if not n:
        return "none checked"
    ranked = sorted(((k, v) for k, v in verdicts.items() if v), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{label(k)} {percent(v / n)} ({count(v)})" for k, v in ranked)


def filtered_by(row: dict) -> str:
    return ", ".join(f"{label(code)} {count(n)}" for code, n in row["filtered_by"].items())


def lead(values: dict) -> list[str]:
    """The headline's sentences (HTML), over the whole run."""
    t = values["total"]
    kept_share = t["kept"] / t["rows"] if t["rows"] else None
    flags = filtered_by(t)
    checked = sum(t["verdicts"].values()) if t["verdicts"] else 0
    parsers = f" ({', '.join(map(html.escape, values['parsers']))})" if values["parsers"] else ""
    return [
        f"<strong>{count(t['kept'])} of {count(t['rows'])} rows kept</strong> ({percent(kept_share)}); left out: "
        + ", ".join(f"{count(t[r])} {r}" for r in LEFT_OUT)
        + (f" (quality flags of the filtered rows: {flags})" if flags else ""),
        f"<strong>{count(t['prompt_tokens'])} prompt tokens and {count(t['output_tokens'])} output tokens</strong>"
        " in the kept rows",
        compute_text(t, values["engines"]),
        f"<strong>Parser checks</strong>{parsers} of {count(checked)} answers: {verdict_mix(t['verdicts'])}",
        f"<strong>{percent(t['truncated_share'])} of answers cut at max_new_tokens</strong> (finish reason length)",
    ]


# Numbers right-aligned in columns of equal digits; a header may wrap, a number never does.
NUMBER = "text-align:right;font-variant-numeric:tabular-nums"
NO_WRAP = ";white-space:nowrap"


def _cells(values: list[str], tag: str, text_columns: set[int]) -> str:
    style = NUMBER + (NO_WRAP if tag == "td" else "")
    return "".join(
        f"<{tag}>{v}</{tag}>" if i in text_columns else f'<{tag} style="{style}">{v}</{tag}>'
        for i, v in enumerate(values)
    )


def _table(caption: str, values: dict, header: list[str], cells_of, text: tuple[str, ...] = ()) -> str:
    """An HTML table of the headline's rows, each after its category (and mode): numbers right-aligned
    (but the names and the columns in `text`), whole rows (a category's, the total) bold."""
    several = values["several_modes"]
    header = ["category", *(["mode"] if several else []), *header]
    text_columns = {*range(1 + several), *map(header.index, text)}
    body = ""
    for r in values["rows"]:
        cells = [html.escape(r["category"])] + ([html.escape(r["mode"])] if several else []) + cells_of(r)
        body += f'<tr style="font-weight:{600 if r["whole"] else 400}">{_cells(cells, "td", text_columns)}</tr>'
    head = _cells(header, "th", text_columns)
    return f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def counts_table(values: dict) -> str:
    """Rows, tokens, truncation and hours per category (and mode), then the totals."""
    unit = values["total"]["projected_unit"]
    header = ["rows", "kept", *LEFT_OUT, "flags of filtered rows", "prompt tokens", "output tokens", "truncated"]
    header += ["job-hours", "GPU-hours", *([f"projected {unit}"] if unit else [])]

    def cells(r: dict) -> list[str]:
        out = [count(r[k]) for k in ("rows", "kept", *LEFT_OUT)] + [filtered_by(r)]
        out += [count(r["prompt_tokens"]), count(r["output_tokens"]), percent(r["truncated_share"])]
        out += [hours(r.get("job_hours")), hours(r.get("gpu_hours"))] if r["whole"] else ["", ""]
        return out + ([hours(r.get("projected_hours")) if r["whole"] else ""] if unit else [])

    return _table("Rows, tokens and hours", values, header, cells, text=("flags of filtered rows",))


def checks_table(values: dict) -> str:
    """The parser checks' verdicts per category (and mode): the share and number of each that occurs."""
    seen = sorted({k for r in values["rows"] for k, v in (r["verdicts"] or {}).items() if v})

    def cells(r: dict) -> list[str]:
        v = r["verdicts"] or {}
        n = sum(v.values())
        shares = [f"{percent(v[k] / n)} ({count(v[k])})" if v.get(k) else "" for k in seen]
        return [count(n) if r["verdicts"] is not None else "–", *shares]

    return _table("Parser-check verdicts", values, ["checked", *map(label, seen)], cells)


def render(values: dict) -> str:
    """The headline as an HTML fragment: its sentences, then the tables per category."""
    items = "".join(f"<li>{line}</li>" for line in lead(values))
    return (
        f'<section id="{HEADLINE_ID}"><h2>What this run produced</h2><ul>{items}</ul>'
        f"{counts_table(values)}{checks_table(values)}</section>\n"
    )


def headline(
    *,
    categories: list[str],
    summary: Path,
    verdict_counts: list[Path],
    generations: list[Path],
    headline: Path,
    projection: list[Path] | None = None,
) -> dict:
    """Write the run's headline (HTML) from its summary, parser checks, generate jobs and pilot projection."""
    checks = {c: orjson.loads(Path(p).read_bytes()) for c, p in zip(categories, verdict_counts)}
    usage = {c: job_usage(read_provenance(p)) for c, p in zip(categories, generations)}
    found = [Path(p) for p in projection or [] if Path(p).exists()]
    values = headline_values(read_table(summary), checks, usage, read_table(found[0]) if found else None)
    headline.parent.mkdir(parents=True, exist_ok=True)
    headline.write_text(render(values), encoding="utf-8")
    for line in lead(values):
        log.info("%s", line.replace("<strong>", "").replace("</strong>", ""))
    return values
