"""Per-category accounting.

The summary counts every row (id, sample_index, turn) exactly once, as ok (exported), skipped, failed
or filtered. It is computed from one streamed pass over each category's generations (lengths from
the Parquet list offsets) and its rejected records. The turns table counts the same rows per turn
index, with the reason of every row that was not produced (a conversation that ended early).
"""

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pandas as pd
import pyarrow.compute as pc

from eagle3_datagen.figures import plot_lengths, plot_turns
from eagle3_datagen.quality.flags import CODES
from eagle3_datagen.storage.prompts import without_source
from eagle3_datagen.storage.tables import DEFAULT_BATCHING, Batching, iter_record_batches, read_provenance

log = logging.getLogger(__name__)

STATUSES = ("ok", "skipped", "failed", "filtered")
# What reading the prompt files changed (prompt_rows._sharegpt_fixes, ReadOptions.system_prompt), per category.
NORMALIZATION = ("speakers_mapped", "leading_assistant_dropped", "same_speaker_merged", "system_prompt_added")


# The generations columns the summary reads; token ids only as list lengths, never as Python lists.
SCAN_COLUMNS = ["id", "sample_index", "turn", "status", "finish_type", "error", "prompt_ids", "output_ids"]


def scan_generations(path: str | Path, batching: Batching = DEFAULT_BATCHING) -> Iterator[dict]:
    """A generations table a batch at a time, as columns: keys, status and finish type as lists, the
    prompt and output lengths as numpy arrays (read from the list offsets, no ids are converted)."""
    for batch in iter_record_batches(path, batching, columns=SCAN_COLUMNS):
        columns = batch.select(["id", "sample_index", "turn", "status", "finish_type", "error"]).to_pydict()
        columns["n_prompt"] = pc.list_value_length(batch["prompt_ids"]).to_numpy(zero_copy_only=False)
        columns["n_output"] = pc.list_value_length(batch["output_ids"]).to_numpy(zero_copy_only=False)
        yield columns


# Why a conversation ended before a turn (turns.Conversation.advance), as a short kind.
ENDINGS = (
    ("was cut at max_new_tokens", "an earlier turn was cut at max_new_tokens"),
    ("failed", "an earlier turn failed"),
    ("tool mismatch", "tool mismatch"),
    ("not with their results", "tool calls without results"),
    ("does not fit the context", "the prompt does not fit the context"),
    ("cannot render", "the template cannot render the history"),
)


def reason_kind(reason: str) -> str:
    """A row's reason without its ids and numbers (rows per kind in the turns table)."""
    if not reason:
        return ""
    if reason.startswith("conversation ended:"):
        for needle, kind in ENDINGS:
            if needle in reason:
                return f"conversation ended: {kind}"
    return re.sub(r"\d+", "N", without_source(reason))[:100]


def read_rejected(rejected: str | Path) -> tuple[dict, dict, dict, dict]:
    """(rows per status, the filtered rows' reasons and quality flags by key, flag counts) of a
    category's rejected records. `quarantined_<code>` counts the flagged rows that were left out,
    whichever flag (its record's `code`) or export filter left them out."""
    counts = {s: 0 for s in STATUSES}
    filtered, flagged = {}, {}  # generated (status ok) but left out of the dataset; ok keys are unique
    quality = {f"flag_{code}": 0 for code in CODES} | {f"quarantined_{code}": 0 for code in CODES}
    for r in iter_jsonl(rejected):
        counts[r["status"]] += 1
        if r["status"] == "filtered":
            key = (r["id"], r["sample_index"], r.get("turn", 0))
            filtered[key] = r["reason"]
            flagged[key] = r.get("flags") or ()
            for code in flagged[key]:  # a filtered row's flags were all left out with it
                quality[f"flag_{code}"] += 1
                quality[f"quarantined_{code}"] += 1
    return counts, filtered, flagged, quality


def category_summary(
    category: str,
    generations: str | Path,
    rejected: str | Path,
    normalization: dict | None = None,
    batching: Batching = DEFAULT_BATCHING,
    merging: dict | None = None,
    turns: Counter | None = None,
) -> tuple[dict, tuple[list[int], list[int]]]:
    """(the category's summary row, the prompt and output lengths of its ok rows), streamed.

    `turns`, when given, gets (turn, status, reason kind) -> [rows, output tokens] of every row."""
    counts, filtered, flagged, quality = read_rejected(rejected)
    n_rejected = sum(counts.values())
    kept_flags = ((merging or {}).get("quality") or {}).get("kept_flags") or {}
    for code, per_turn in kept_flags.items():
        quality[f"flag_{code}"] += sum(per_turn.values())
    rows = n_ok = truncated = ok_output = prompt_tokens = output_tokens = 0
    prompt_lengths: list[int] = []
    output_lengths: list[int] = []
    for batch in scan_generations(generations, batching):
        rows += len(batch["id"])
        for i, status in enumerate(batch["status"]):
            n_output = int(batch["n_output"][i])
            key = (batch["id"][i], batch["sample_index"][i], batch["turn"][i])
            if turns is not None:
                final = "filtered" if status == "ok" and key in filtered else status
                why = filtered.get(key, "") if final == "filtered" else batch["error"][i] or ""
                cell = turns.setdefault((int(batch["turn"][i]), final, reason_kind(why)), [0, 0, Counter()])
                cell[0] += 1
                cell[1] += n_output
                if final == "filtered":
                    cell[2].update(flagged.get(key, ()))
            if status != "ok":
                continue
            n_prompt = int(batch["n_prompt"][i])
            n_ok += 1
            ok_output += n_output
            truncated += batch["finish_type"][i] == "length"
            prompt_lengths.append(n_prompt)
            output_lengths.append(n_output)
            if key not in filtered:
                prompt_tokens += n_prompt
                output_tokens += n_output
    counts["ok"] = rows - n_rejected
    if turns is not None:
        for code, per_turn in kept_flags.items():
            for turn, n in per_turn.items():
                turns.setdefault((int(turn), "ok", ""), [0, 0, Counter()])[2][code] += n
    merging = merging or {}
    summary = {
        "category": category,
        "rows": rows,
        **counts,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "mean_output_tokens": round(ok_output / n_ok, 1) if n_ok else 0.0,
        "truncated_share": round(truncated / n_ok, 4) if n_ok else 0.0,
        **quality,
        "turns_merged": int(merging.get("turns_merged", 0)),
        "turns_not_merged": int(sum((merging.get("turns_not_merged") or {}).values())),
        "why_not_merged": "; ".join(
            f"{n} x {why}" for why, n in sorted((merging.get("turns_not_merged") or {}).items())
        ),
        **{kind: int((normalization or {}).get(kind, 0)) for kind in NORMALIZATION},
    }
    return summary, (prompt_lengths, output_lengths)


def write_turns(per_category: dict[str, Counter], path: Path) -> pd.DataFrame:
    """Rows and output tokens per category, turn index, status and reason (the turns table), and how
    many of those rows each quality flag marks (`flag_<code>`)."""
    records = [
        {
            "category": category,
            "turn": turn,
            "status": status,
            "reason": reason,
            "rows": n,
            "output_tokens": tokens,
            **{f"flag_{code}": int(flags[code]) for code in CODES},
        }
        for category, cells in per_category.items()
        for (turn, status, reason), (n, tokens, flags) in sorted(cells.items())
    ]
    columns = ["category", "turn", "status", "reason", "rows", "output_tokens", *(f"flag_{c}" for c in CODES)]
    frame = pd.DataFrame(records, columns=columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, sep="\t", index=False)
    return frame


def write_summary(rows: list[dict], path: Path) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    total = {"category": "total"}
    for col in (
        "rows",
        *STATUSES,
        "prompt_tokens",
        "output_tokens",
        "turns_merged",
        "turns_not_merged",
        *NORMALIZATION,
        *(f"flag_{code}" for code in CODES),
        *(f"quarantined_{code}" for code in CODES),
    ):
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
    total["why_not_merged"] = ""
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
    dataset_parquet: list[Path],
    summary: Path,
    turns_summary: Path,
    lengths_png: Path,
    turns_png: Path,
    batch: dict | None = None,
) -> pd.DataFrame:
    """Count every row by status, tokens in and out, per category and per turn, and draw the length
    and turn figures, a batch at a time."""
    batching = Batching.from_config(batch)
    rows, lengths, per_turn = [], {}, {}
    for category, gen_path, rej_path, dataset_path in zip(categories, generations, rejected, dataset_parquet):
        normalization = read_provenance(gen_path).get("prompts", {}).get("normalization", {})
        per_turn[category] = Counter()
        row, lengths[category] = category_summary(
            category,
            gen_path,
            rej_path,
            normalization,
            batching,
            merging=read_provenance(dataset_path),
            turns=per_turn[category],
        )
        rows.append(row)
    frame = write_summary(rows, summary)
    turns = write_turns(per_turn, turns_summary)
    plot_lengths(lengths, lengths_png)
    plot_turns(turns, turns_png)
    log.info("summary:\n%s", frame.to_string(index=False))
    log.info("rows per turn:\n%s", turns.to_string(index=False))
    return frame
