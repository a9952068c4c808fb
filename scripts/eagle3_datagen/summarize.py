"""Per-category accounting.

The summary counts every input row exactly once, as ok (exported), skipped, failed or filtered. It
is computed from one streamed pass over each category's generations (lengths from the Parquet list
offsets) and its rejected records.
"""

import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pandas as pd
import pyarrow.compute as pc

from .figures import plot_lengths
from .tables import DEFAULT_BATCHING, Batching, iter_record_batches, read_provenance

log = logging.getLogger(__name__)

STATUSES = ("ok", "skipped", "failed", "filtered")
# What reading the prompt files changed (prompts._sharegpt_fixes, ReadOptions.system_prompt), per category.
NORMALIZATION = ("speakers_mapped", "leading_assistant_dropped", "same_speaker_merged", "system_prompt_added")


# The generations columns the summary reads; token ids only as list lengths, never as Python lists.
SCAN_COLUMNS = ["id", "sample_index", "status", "finish_type", "prompt_ids", "output_ids"]


def scan_generations(path: str | Path, batching: Batching = DEFAULT_BATCHING) -> Iterator[dict]:
    """A generations table a batch at a time, as columns: keys, status and finish type as lists, the
    prompt and output lengths as numpy arrays (read from the list offsets, no ids are converted)."""
    for batch in iter_record_batches(path, batching, columns=SCAN_COLUMNS):
        columns = batch.select(["id", "sample_index", "status", "finish_type"]).to_pydict()
        columns["n_prompt"] = pc.list_value_length(batch["prompt_ids"]).to_numpy(zero_copy_only=False)
        columns["n_output"] = pc.list_value_length(batch["output_ids"]).to_numpy(zero_copy_only=False)
        yield columns


def category_summary(
    category: str,
    generations: str | Path,
    rejected: str | Path,
    normalization: dict | None = None,
    batching: Batching = DEFAULT_BATCHING,
) -> tuple[dict, tuple[list[int], list[int]]]:
    """(the category's summary row, the prompt and output lengths of its ok rows), streamed."""
    counts = {s: 0 for s in STATUSES}
    filtered = set()  # generated (status ok) but left out of the dataset; ok keys are unique
    n_rejected = 0
    for r in iter_jsonl(rejected):
        counts[r["status"]] += 1
        n_rejected += 1
        if r["status"] == "filtered":
            filtered.add((r["id"], r["sample_index"]))
    rows = n_ok = truncated = ok_output = prompt_tokens = output_tokens = 0
    prompt_lengths: list[int] = []
    output_lengths: list[int] = []
    for batch in scan_generations(generations, batching):
        rows += len(batch["id"])
        for i, status in enumerate(batch["status"]):
            if status != "ok":
                continue
            n_prompt, n_output = int(batch["n_prompt"][i]), int(batch["n_output"][i])
            n_ok += 1
            ok_output += n_output
            truncated += batch["finish_type"][i] == "length"
            prompt_lengths.append(n_prompt)
            output_lengths.append(n_output)
            if (batch["id"][i], batch["sample_index"][i]) not in filtered:
                prompt_tokens += n_prompt
                output_tokens += n_output
    counts["ok"] = rows - n_rejected
    summary = {
        "category": category,
        "rows": rows,
        **counts,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "mean_output_tokens": round(ok_output / n_ok, 1) if n_ok else 0.0,
        "truncated_share": round(truncated / n_ok, 4) if n_ok else 0.0,
        **{kind: int((normalization or {}).get(kind, 0)) for kind in NORMALIZATION},
    }
    return summary, (prompt_lengths, output_lengths)


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


def iter_jsonl(path: str | Path) -> Iterator[dict]:
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                yield orjson.loads(line)


def summarize(
    *,
    categories: list[str],
    generations: list[Path],
    rejected: list[Path],
    summary: Path,
    lengths_png: Path,
    batch: dict | None = None,
) -> pd.DataFrame:
    """Count every row by status, tokens in and out, and draw the length figure, a batch at a time."""
    batching = Batching.from_config(batch)
    rows, lengths = [], {}
    for category, gen_path, rej_path in zip(categories, generations, rejected):
        normalization = read_provenance(gen_path).get("prompts", {}).get("normalization", {})
        row, lengths[category] = category_summary(category, gen_path, rej_path, normalization, batching)
        rows.append(row)
    frame = write_summary(rows, summary)
    plot_lengths(lengths, lengths_png)
    log.info("summary:\n%s", frame.to_string(index=False))
    return frame
