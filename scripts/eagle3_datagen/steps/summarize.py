"""Per-category and per-mode accounting, streamed from each category's generations and rejected records.

The summary counts every row (id, sample_index, turn, mode) exactly once, as ok (exported), skipped,
failed or filtered; the turns table counts them per turn index, with the reason of each row not produced.
"""

import functools
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pandas as pd
import pyarrow.compute as pc

from eagle3_datagen.figures.base import by_series, save, series_name
from eagle3_datagen.figures.runs import draw_lengths, draw_turns
from eagle3_datagen.generation.turns import ORIGINAL
from eagle3_datagen.quality.flags import CODES
from eagle3_datagen.settings import ALL_MODES, DEFAULT_MODE, mode_totals
from eagle3_datagen.storage.prompts import without_source
from eagle3_datagen.storage.tables import DEFAULT_BATCHING, Batching, iter_record_batches, read_provenance

log = logging.getLogger(__name__)

STATUSES = ("ok", "skipped", "failed", "filtered")
# What reading the prompt files changed (prompt_rows._sharegpt_fixes, ReadOptions.system_prompt), per category.
NORMALIZATION = ("speakers_mapped", "leading_assistant_dropped", "same_speaker_merged", "system_prompt_added")
QUALITY_COLUMNS = (*(f"flag_{code}" for code in CODES), *(f"quarantined_{code}" for code in CODES))


# The generations columns the summary reads; token ids only as list lengths, never as Python lists.
SCAN_COLUMNS = [
    "id",
    "sample_index",
    "turn",
    "mode",
    "history",
    "status",
    "finish_type",
    "error",
    "max_new_tokens",
    "prompt_ids",
    "output_ids",
]


def scan_generations(path: str | Path, batching: Batching = DEFAULT_BATCHING) -> Iterator[dict]:
    """A generations table a batch at a time, as columns: keys, status and finish type as lists, the
    prompt and output lengths as numpy arrays (read from the list offsets, no ids are converted)."""
    for batch in iter_record_batches(path, batching, columns=SCAN_COLUMNS):
        columns = batch.select(SCAN_COLUMNS[:-2]).to_pydict()
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
    ("of the conversation", "an empty message in the conversation"),
)


def reason_kind(reason: str) -> str:
    """A row's reason without its ids and numbers (rows per kind in the turns table)."""
    if reason.startswith("conversation ended:"):
        for needle, kind in ENDINGS:
            if needle in reason:
                return f"conversation ended: {kind}"
    return re.sub(r"\d+", "N", without_source(reason))[:100]


def read_rejected(rejected: str | Path) -> tuple[dict, dict, dict, dict]:
    """({mode: rows per status}, the filtered rows' reasons and quality flags by key, {mode: flag
    counts}) of a category's rejected records: every flag of a filtered row counts as quarantined."""
    counts: dict[str, dict] = {}
    quality: dict[str, dict] = {}
    filtered, flagged = {}, {}  # generated (status ok) but left out of the dataset; ok keys are unique
    with open(rejected, "rb") as fh:
        for r in (orjson.loads(line) for line in fh if line.strip()):
            mode = r.get("mode") or DEFAULT_MODE
            counts.setdefault(mode, {s: 0 for s in STATUSES})[r["status"]] += 1
            tally = quality.setdefault(mode, Counter())
            if r["status"] == "filtered":
                key = (r["id"], r["sample_index"], r.get("turn", 0), mode)
                filtered[key] = r["reason"]
                flagged[key] = r.get("flags") or ()
                for code in flagged[key]:  # a filtered row's flags were all left out with it
                    tally[f"flag_{code}"] += 1
                    tally[f"quarantined_{code}"] += 1
    return counts, filtered, flagged, quality


class _ModeTally:
    """One (category, mode)'s counts (`n`: rows, tokens, statuses, flags), as its summary row is made of them."""

    def __init__(self):
        self.n: Counter = Counter()
        self.budget = 0  # the largest max_new_tokens an answer was given (its mode's, where the context allows)
        self.not_merged: Counter = Counter()

    def add(self, other: "_ModeTally") -> "_ModeTally":
        self.n.update(other.n)
        self.not_merged.update(other.not_merged)
        self.budget = max(self.budget, other.budget)
        return self

    def row(self, category: str, mode: str, normalization: dict | None) -> dict:
        """The summary row; `normalization` (what reading the file changed) only on a category's
        whole row: it counts conversations as read, before any mode."""
        n, n_ok = self.n, self.n["n_ok"]
        return {
            "category": category,
            "mode": mode,
            "rows": n["rows"],
            **{status: n[status] for status in STATUSES},
            "prompt_tokens": n["prompt_tokens"],
            "output_tokens": n["output_tokens"],
            "mean_output_tokens": round(n["ok_output"] / n_ok, 1) if n_ok else 0.0,
            "truncated_share": round(n["truncated"] / n_ok, 4) if n_ok else 0.0,
            "max_new_tokens": self.budget,
            # `original`: ok rows rendered on an original answer (tool_divergence: original)
            "on_policy_rows": n_ok - n["original"],
            "original_history_rows": n["original"],
            **{key: n[key] for key in QUALITY_COLUMNS},
            "turns_merged": n["turns_merged"],
            "turns_not_merged": int(sum(self.not_merged.values())),
            "why_not_merged": "; ".join(f"{k} x {why}" for why, k in sorted(self.not_merged.items())),
            **{
                kind: (int(normalization.get(kind, 0)) if normalization is not None else None) for kind in NORMALIZATION
            },
        }


def category_summary(
    category: str,
    generations: str | Path,
    rejected: str | Path,
    normalization: dict | None = None,
    batching: Batching = DEFAULT_BATCHING,
    merging: dict | None = None,
    turns: Counter | None = None,
) -> tuple[list[dict], dict[str, tuple[list[int], list[int]]]]:
    """(the category's summary rows: per serving mode, and as mode `all` when it has several; the prompt
    and output lengths of its ok rows per mode); `turns` gets the turns table's cells of every row."""
    counts, filtered, flagged, quality = read_rejected(rejected)
    merging = merging or {}
    kept_by_mode = (merging.get("quality") or {}).get("kept_flags_by_mode") or {}
    tallies: dict[str, _ModeTally] = {}
    lengths: dict[str, tuple[list[int], list[int]]] = {}
    for batch in scan_generations(generations, batching):
        for i, status in enumerate(batch["status"]):
            mode = batch["mode"][i] or DEFAULT_MODE
            tally = tallies.get(mode) or tallies.setdefault(mode, _ModeTally())
            tally.n["rows"] += 1
            n_output = int(batch["n_output"][i])
            key = (batch["id"][i], batch["sample_index"][i], batch["turn"][i], mode)
            if turns is not None:
                final = "filtered" if status == "ok" and key in filtered else status
                why = filtered.get(key, "") if final == "filtered" else batch["error"][i] or ""
                cell = turns.setdefault((mode, int(batch["turn"][i]), final, reason_kind(why)), [0, 0, Counter()])
                cell[0] += 1
                cell[1] += n_output
                if final == "filtered":
                    cell[2].update(flagged.get(key, ()))
            if status != "ok":
                continue
            n_prompt = int(batch["n_prompt"][i])
            tally.n.update(n_ok=1, ok_output=n_output, truncated=batch["finish_type"][i] == "length")
            tally.n["original"] += batch["history"][i] == ORIGINAL
            tally.budget = max(tally.budget, int(batch["max_new_tokens"][i]))
            pair = lengths.setdefault(mode, ([], []))
            pair[0].append(n_prompt)
            pair[1].append(n_output)
            if key not in filtered:
                tally.n.update(prompt_tokens=n_prompt, output_tokens=n_output)
    for mode, tally in tallies.items():
        tally.n.update(counts.get(mode, {}))
        tally.n["ok"] = tally.n["rows"] - sum(counts.get(mode, {}).values())
        tally.n.update(quality.get(mode, {}))
        for code, per_turn in (kept_by_mode.get(mode) or {}).items():
            tally.n[f"flag_{code}"] += sum(per_turn.values())
            if turns is not None:
                for turn, n in per_turn.items():
                    turns.setdefault((mode, int(turn), "ok", ""), [0, 0, Counter()])[2][code] += n
        by_mode = (merging.get("by_mode") or {}).get(mode) or {}
        tally.n["turns_merged"] = int(by_mode.get("turns_merged", 0))
        tally.not_merged.update(by_mode.get("turns_not_merged") or {})
    if not tallies:  # an empty category still has its row
        tallies[DEFAULT_MODE] = _ModeTally()
    if len(tallies) == 1:
        return [tally.row(category, mode, normalization or {}) for mode, tally in tallies.items()], lengths
    whole = functools.reduce(_ModeTally.add, tallies.values(), _ModeTally())
    rows = [tally.row(category, mode, None) for mode, tally in tallies.items()]
    return rows + [whole.row(category, ALL_MODES, normalization or {})], lengths


def write_turns(per_category: dict[str, Counter], path: Path) -> pd.DataFrame:
    """The turns table: rows, output tokens and `flag_<code>` per category, mode, turn, status and reason."""
    columns = ["category", "mode", "turn", "status", "reason", "rows", "output_tokens", *(f"flag_{c}" for c in CODES)]
    records = [
        (category, mode, turn, status, reason, n, tokens, *(int(flags[code]) for code in CODES))
        for category, cells in per_category.items()
        for (mode, turn, status, reason), (n, tokens, flags) in sorted(cells.items())
    ]
    frame = pd.DataFrame(records, columns=columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, sep="\t", index=False)
    return frame


SUMMED = (
    "rows",
    *STATUSES,
    "prompt_tokens",
    "output_tokens",
    "turns_merged",
    "turns_not_merged",
    *QUALITY_COLUMNS,
)


def _total(frame: pd.DataFrame, mode: str, normalization: bool) -> dict:
    """A total row over summary rows that do not overlap."""
    total = {"category": "total", "mode": mode} | {col: int(frame[col].sum()) for col in SUMMED}
    generated = frame["ok"] + frame["filtered"]
    n = int(generated.sum())
    total["mean_output_tokens"] = round(float((frame["mean_output_tokens"] * generated).sum()) / n, 1) if n else 0.0
    total["truncated_share"] = round(float((frame["truncated_share"] * generated).sum()) / n, 4) if n else 0.0
    total["max_new_tokens"] = int(frame["max_new_tokens"].max()) if "max_new_tokens" in frame and len(frame) else 0
    total["why_not_merged"] = ""
    return total | {kind: int(frame[kind].sum()) if normalization else None for kind in NORMALIZATION}


def write_summary(rows: list[dict], path: Path) -> pd.DataFrame:
    """The summary table: a row per category and mode, a category's whole row (mode `all`) where it
    has several, then the totals (per mode where the run has several, and over everything)."""
    frame = pd.DataFrame(rows)
    per_mode = frame[frame["mode"] != ALL_MODES]
    separate, overall = mode_totals(list(dict.fromkeys(per_mode["mode"])))
    whole = frame[(frame["mode"] == ALL_MODES) | ~frame["category"].isin(frame[frame["mode"] == ALL_MODES]["category"])]
    totals = [_total(per_mode[per_mode["mode"] == mode], mode, False) for mode in separate]
    totals.append(_total(whole, overall, True))
    frame = pd.concat([frame, pd.DataFrame(totals)], ignore_index=True).astype({k: "Int64" for k in NORMALIZATION})
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, sep="\t", index=False)
    return frame


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
        summary_rows, lengths[category] = category_summary(
            category,
            gen_path,
            rej_path,
            normalization,
            batching,
            merging=read_provenance(dataset_path),
            turns=per_turn[category],
        )
        rows += summary_rows
    frame = write_summary(rows, summary)
    turns = write_turns(per_turn, turns_summary)
    # The figures draw a series per category, and per category and mode where the run has several.
    several = len({mode for by_mode in lengths.values() for mode in by_mode} | set(turns["mode"])) > 1
    save(draw_lengths(by_series(lengths, several)), lengths_png)
    series = turns.assign(category=[series_name(c, m, several) for c, m in zip(turns["category"], turns["mode"])])
    save(draw_turns(series), turns_png)
    log.info("summary:\n%s", frame.to_string(index=False))
    log.info("rows per turn:\n%s", turns.to_string(index=False))
    return frame
