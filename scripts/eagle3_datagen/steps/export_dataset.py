"""Export: trainer-ready rows (`input_ids`, `loss_mask`: the shape SpecForge's pre-tokenized path and
speculators' `prepare_data.py` both read, docs/data.md) plus an account of every row left out.
"""

import hashlib
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa

from eagle3_datagen.quality.gate import Gate, reason_of
from eagle3_datagen.settings import DEFAULT_MODE, ExportSettings
from eagle3_datagen.storage.disk import AtomicFile
from eagle3_datagen.storage.tables import IDS, Batching, TableWriter, count_rows, iter_batches, logged, read_provenance
from eagle3_datagen.storage.trainer_rows import dataset_row

log = logging.getLogger(__name__)

DATASET_SCHEMA = pa.schema(
    [
        ("input_ids", IDS),
        ("loss_mask", pa.list_(pa.int8())),
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        ("turn", pa.int32()),
        # The serving mode the row was generated in (model.modes; "default" for a profile without modes).
        ("mode", pa.string()),
        # Turns joined in this row (export.merge_turns): 1 unless consecutive turns were merged.
        ("turns", pa.int32()),
        ("category", pa.string()),
        ("finish_type", pa.string()),
        ("n_prompt_tokens", pa.int32()),
        ("n_output_tokens", pa.int32()),
        ("seed", pa.int64()),
        # The quality gate's flags that the policy keeps (config quality.policies), of every merged turn.
        ("flags", pa.list_(pa.string())),
    ]
)


@dataclass(frozen=True)
class Filters:
    """Which generated rows the export leaves out (config `export.filters`; defaults in the schema)."""

    drop_truncated: bool
    min_loss_tokens: int
    max_length: int | None = None

    @classmethod
    def from_config(cls, export: dict | None = None, **overrides) -> "Filters":
        return cls(**{**ExportSettings.from_config(export).filters, **overrides})


def filter_reason(row: dict, filters: Filters) -> tuple[str, str] | None:
    """(the filter's code, the reason) of a row an `export.filters` setting leaves out, or None."""
    n_output = len(row["output_ids"])
    if filters.drop_truncated and row["finish_type"] == "length":
        return "truncated", f"truncated: finish_type length after {n_output} tokens (export.filters.drop_truncated)"
    if n_output < filters.min_loss_tokens:
        return (
            "min_loss_tokens",
            f"{n_output} loss tokens, fewer than export.filters.min_loss_tokens {filters.min_loss_tokens}",
        )
    n_tokens = len(row["prompt_ids"]) + n_output
    if filters.max_length is not None and n_tokens > filters.max_length:
        return "max_length", (
            f"{n_tokens} tokens, longer than export.filters.max_length {filters.max_length} "
            "(the trainer's maximum length: it would cut the row)"
        )
    return None


def split_rows(generations: list[dict], filters: Filters, gate: Gate | None = None) -> tuple[list[dict], list[dict]]:
    """(generation rows for the dataset, rejected records): every row lands in exactly one of the two,
    an ok row judged by the quality `gate` first, then by the export filters."""
    dataset, rejected = [], []
    for row in generations:
        status, reason, code, flags = row["status"], row.get("error") or "", "", []
        if status == "ok":
            quarantined = None
            if gate is not None:
                flags, quarantined = gate.judge(row)
            filtered = (quarantined.code, reason_of(quarantined)) if quarantined else filter_reason(row, filters)
            if filtered is None:
                if gate is not None:
                    gate.kept.update((f.code, int(row["turn"]), row.get("mode") or DEFAULT_MODE) for f in flags)
                dataset.append({**row, "flags": [f.code for f in flags]})
                continue
            status, (code, reason) = "filtered", filtered
        record = {
            "id": row["id"],
            "sample_index": int(row["sample_index"]),
            "turn": int(row["turn"]),
            "mode": row.get("mode") or DEFAULT_MODE,
            "category": row["category"],
            "status": status,
            "reason": reason,
        }
        if status == "filtered":
            record["code"] = code
            record["flags"] = [f.code for f in flags]
        rejected.append(record)
    return dataset, rejected


# Why a turn was not merged into the row of the turn before it.
NOT_EXTENDED = "its prompt does not start with the turn before's prompt_ids + output_ids"
GAP = "the turn before is not in the dataset (filtered)"


class TurnMerger:
    """Dataset rows of generation rows in conversation order; with `merge`, a turn whose `prompt_ids`
    start with the turn before's `prompt_ids + output_ids` joins its row (a loss span per turn). `feed`
    holds a chain's last row back until the next turn shows whether it extends it; `flush` gives it."""

    def __init__(self, merge: bool):
        self.merge = merge
        self.merged: Counter = Counter()
        self.not_merged: dict[str, Counter] = {}
        self._last: dict | None = None
        self._spans: list[tuple[int, int]] = []  # a loss span per turn of the chain
        self._flags: set[str] = set()

    def flush(self) -> list[dict]:
        """The row of the chain held back, if any."""
        if self._last is None:
            return []
        row = dataset_row(self._last, self._spans, len(self._spans), sorted(self._flags))
        self._last = None
        return [row]

    def feed(self, rows: Iterable[dict]) -> list[dict]:
        out: list[dict] = []
        for row in rows:
            mode = row.get("mode") or DEFAULT_MODE
            if not self.merge:
                out.append(dataset_row(row))
                if row["turn"]:
                    self._not_merged(mode, "merge_turns is off")
                continue
            last, prompt = self._last, row["prompt_ids"]
            span = (len(prompt), len(prompt) + len(row["output_ids"]))
            if last is not None and _conversation(last) == _conversation(row) and row["turn"] == last["turn"] + 1:
                before = len(last["prompt_ids"]) + len(last["output_ids"])
                if prompt[:before] == last["prompt_ids"] + last["output_ids"]:
                    self._last = row
                    self._spans.append(span)
                    self._flags.update(row.get("flags") or ())
                    self.merged[mode] += 1
                    continue
                self._not_merged(mode, NOT_EXTENDED)
            elif row["turn"]:
                self._not_merged(mode, GAP)
            out += self.flush()
            self._last, self._spans, self._flags = row, [span], set(row.get("flags") or ())
        return out

    def _not_merged(self, mode: str, why: str) -> None:
        self.not_merged.setdefault(mode, Counter())[why] += 1

    def stats(self) -> dict:
        return {
            "merge_turns": self.merge,
            "turns_merged": sum(self.merged.values()),
            "turns_not_merged": dict(sum(self.not_merged.values(), Counter())),
            "by_mode": {
                mode: {"turns_merged": self.merged[mode], "turns_not_merged": dict(self.not_merged.get(mode, {}))}
                for mode in sorted(set(self.merged) | set(self.not_merged))
            },
        }


def _conversation(row: dict) -> tuple:
    return row["id"], row["sample_index"], row.get("mode")


class JsonlWriter(AtomicFile):
    """JSON lines written atomically as they come (orjson: `json.dumps(row, ensure_ascii=False,
    separators=(",", ":"))`, several times faster on long id lists)."""

    def __init__(self, path: str | Path):
        super().__init__(path, what="JSON lines file")
        self.rows = 0

    def write(self, rows: Iterable[dict]) -> None:
        for row in rows:
            super().write(orjson.dumps(row) + b"\n")
            self.rows += 1


def export_category(
    generations: Iterable[list[dict]],
    filters: Filters,
    *,
    jsonl: Path,
    parquet: Path,
    rejected: Path,
    batching=None,
    merge_turns: bool = False,
    gate: Gate | None = None,
) -> dict:
    """Export batches of generations rows: dataset rows to `jsonl` and `parquet`, the rest to `rejected`."""
    batching = batching or Batching()
    merger = TurnMerger(merge_turns)
    with (
        JsonlWriter(jsonl) as dataset_out,
        TableWriter(parquet, DATASET_SCHEMA, batching) as parquet_out,
        JsonlWriter(rejected) as rejected_out,
    ):
        for rows in generations:
            kept, rejected_rows = split_rows(rows, filters, gate)
            dataset = merger.feed(kept)
            dataset_out.write(dataset)
            parquet_out.write(dataset)
            rejected_out.write(rejected_rows)
        last = merger.flush()
        dataset_out.write(last)
        parquet_out.write(last)
        quality = {"quality": gate.stats()} if gate is not None else {}
        parquet_out.close({**merger.stats(), **quality})
    return {"exported": dataset_out.rows, "rejected": rejected_out.rows, **merger.stats(), **quality}


# A dataset line starts with its input ids, as `dataset_row` orders the keys.
INPUT_IDS_PREFIX = b'{"input_ids":['


def sequence_digest(line: bytes) -> bytes:
    """A digest of a dataset line's input ids, read from the line's text without parsing it
    (the ids are plain integers: the text between the brackets is the sequence)."""
    if line.startswith(INPUT_IDS_PREFIX):
        end = line.find(b"]", len(INPUT_IDS_PREFIX))
        ids = line[len(INPUT_IDS_PREFIX) : end]
    else:  # a line of another key order: parse it
        ids = orjson.dumps(orjson.loads(line)["input_ids"])[1:-1]
    return hashlib.blake2b(ids, digest_size=16).digest()


def export_dataset(
    *,
    generations: Path,
    dataset: Path,
    dataset_parquet: Path,
    rejected: Path,
    export: dict,
    quality: dict | None = None,
    batch: dict | None = None,
) -> dict:
    """Export one category, a batch at a time: trainer rows to `dataset` (+ Parquet), every row left
    out (the quality gate's quarantine and the export filters) to `rejected`."""
    batching = Batching.from_config(batch)
    counts = export_category(
        logged(iter_batches(generations, batching), count_rows(generations), "export_dataset"),
        Filters.from_config(export),
        jsonl=dataset,
        parquet=dataset_parquet,
        rejected=rejected,
        batching=batching,
        merge_turns=ExportSettings.from_config(export).merge_turns,
        gate=Gate.from_provenance(quality, read_provenance(generations)),
    )
    log.info("%s: %s", generations, counts)
    return counts


def merge_dataset(*, dataset: list[Path], train: Path) -> dict:
    """Merge every category's dataset into one train.jsonl, keeping the first of identical token
    sequences: lines are copied as they are and only a 16-byte digest per sequence is remembered."""
    seen: set[bytes] = set()
    kept = duplicates = 0
    with AtomicFile(train, what="JSON lines file") as dst:
        for path in dataset:
            with open(path, "rb") as src:
                for line in src:
                    digest = sequence_digest(line)
                    if digest in seen:
                        duplicates += 1
                        continue
                    seen.add(digest)
                    dst.write(line)
                    kept += 1
    counts = {"rows": kept, "duplicates_dropped": duplicates}
    log.info("merged %d files into %s: %s", len(dataset), train, counts)
    return counts
