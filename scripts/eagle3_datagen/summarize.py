"""Per-category accounting.

The summary counts every input row exactly once, as ok (exported), skipped, failed or filtered.
"""

import json
import logging
from pathlib import Path

import pandas as pd

from .figures import plot_lengths
from .tables import read_provenance, read_rows

log = logging.getLogger(__name__)

STATUSES = ("ok", "skipped", "failed", "filtered")
# What reading the prompt files changed (prompts._sharegpt_fixes, ReadOptions.system_prompt), per category.
NORMALIZATION = ("speakers_mapped", "leading_assistant_dropped", "same_speaker_merged", "system_prompt_added")


def category_summary(
    category: str, generations: list[dict], rejected: list[dict], normalization: dict | None = None
) -> dict:
    counts = {s: 0 for s in STATUSES}
    for r in rejected:
        counts[r["status"]] += 1
    counts["ok"] = len(generations) - len(rejected)
    ok_rows = [g for g in generations if g["status"] == "ok"]
    # Filtered rows were generated (status ok) but left out of the dataset; ok keys are unique.
    filtered = {(r["id"], r["sample_index"]) for r in rejected if r["status"] == "filtered"}
    exported = [g for g in ok_rows if (g["id"], g["sample_index"]) not in filtered]
    truncated = sum(g["finish_type"] == "length" for g in ok_rows)
    return {
        "category": category,
        "rows": len(generations),
        **counts,
        "prompt_tokens": sum(len(g["prompt_ids"]) for g in exported),
        "output_tokens": sum(len(g["output_ids"]) for g in exported),
        "mean_output_tokens": round(sum(len(g["output_ids"]) for g in ok_rows) / len(ok_rows), 1) if ok_rows else 0.0,
        "truncated_share": round(truncated / len(ok_rows), 4) if ok_rows else 0.0,
        **{kind: int((normalization or {}).get(kind, 0)) for kind in NORMALIZATION},
    }


def write_summary(rows: list[dict], path: Path) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    total = {"category": "total"}
    for col in ("rows", *STATUSES, "prompt_tokens", "output_tokens", *NORMALIZATION):
        total[col] = int(frame[col].sum())
    ok_total = int(frame["ok"].sum()) + int(frame["filtered"].sum())
    total["mean_output_tokens"] = (
        round(float((frame["mean_output_tokens"] * (frame["ok"] + frame["filtered"])).sum()) / ok_total, 1)
        if ok_total
        else 0.0
    )
    total["truncated_share"] = (
        round(float((frame["truncated_share"] * (frame["ok"] + frame["filtered"])).sum()) / ok_total, 4)
        if ok_total
        else 0.0
    )
    frame = pd.concat([frame, pd.DataFrame([total])], ignore_index=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, sep="\t", index=False)
    return frame


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def summarize(
    *, categories: list[str], generations: list[Path], rejected: list[Path], summary: Path, lengths_png: Path
) -> pd.DataFrame:
    """Count every row by status, tokens in and out, and draw the length figure."""
    rows, lengths = [], {}
    for category, gen_path, rej_path in zip(categories, generations, rejected):
        gens = read_rows(gen_path)
        normalization = read_provenance(gen_path).get("prompts", {}).get("normalization", {})
        rows.append(category_summary(category, gens, read_jsonl(rej_path), normalization))
        ok = [g for g in gens if g["status"] == "ok"]
        lengths[category] = ([len(g["prompt_ids"]) for g in ok], [len(g["output_ids"]) for g in ok])
    frame = write_summary(rows, summary)
    plot_lengths(lengths, lengths_png)
    log.info("summary:\n%s", frame.to_string(index=False))
    return frame
