"""Export: trainer-ready rows (`input_ids`, `loss_mask`) plus an account of every row left out.

The row shape is the one SpecForge's pre-tokenized path and speculators' `prepare_data.py` both read:
`{"input_ids": prompt_ids + output_ids, "loss_mask": [0]*len(prompt) + [1]*len(output)}`; the other
keys travel along and both trainers ignore them.
"""

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from .settings import defaults
from .tables import IDS, read_rows, write_table

log = logging.getLogger(__name__)

DATASET_SCHEMA = pa.schema(
    [
        ("input_ids", IDS),
        ("loss_mask", pa.list_(pa.int8())),
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        ("category", pa.string()),
        ("finish_type", pa.string()),
        ("n_prompt_tokens", pa.int32()),
        ("n_output_tokens", pa.int32()),
        ("seed", pa.int64()),
    ]
)


@dataclass(frozen=True)
class Filters:
    """Which generated rows the export leaves out (config `export.filters`; defaults in the schema)."""

    drop_truncated: bool
    min_loss_tokens: int

    @classmethod
    def from_config(cls, export: dict | None = None, **overrides) -> "Filters":
        filters = defaults("export", **(export or {}))["filters"]
        return cls(**{**filters, **overrides})


def filter_reason(row: dict, filters: Filters) -> str | None:
    n_output = len(row["output_ids"])
    if filters.drop_truncated and row["finish_type"] == "length":
        return f"truncated: finish_type length after {n_output} tokens (export.filters.drop_truncated)"
    if n_output < filters.min_loss_tokens:
        return f"{n_output} loss tokens, fewer than export.filters.min_loss_tokens {filters.min_loss_tokens}"
    return None


def dataset_row(row: dict) -> dict:
    prompt, output = list(row["prompt_ids"]), list(row["output_ids"])
    mask = [0] * len(prompt) + [1] * len(output)
    input_ids = prompt + output
    if len(mask) != len(input_ids) or sum(mask) != len(output) or not output:
        raise AssertionError(f"loss_mask contract broken for {row['id']}.{row['sample_index']}")
    return {
        "input_ids": input_ids,
        "loss_mask": mask,
        "id": row["id"],
        "sample_index": int(row["sample_index"]),
        "category": row["category"],
        "finish_type": row["finish_type"],
        "n_prompt_tokens": len(prompt),
        "n_output_tokens": len(output),
        "seed": int(row["seed"]),
    }


def split_rows(generations: list[dict], filters: Filters) -> tuple[list[dict], list[dict]]:
    """(dataset rows, rejected records): every generation row lands in exactly one of the two."""
    dataset, rejected = [], []
    for row in generations:
        status, reason = row["status"], row.get("error") or ""
        if status == "ok":
            why = filter_reason(row, filters)
            if why is None:
                dataset.append(dataset_row(row))
                continue
            status, reason = "filtered", why
        rejected.append(
            {
                "id": row["id"],
                "sample_index": int(row["sample_index"]),
                "category": row["category"],
                "status": status,
                "reason": reason,
            }
        )
    return dataset, rejected


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
    tmp.replace(path)


def export_category(generations: list[dict], filters: Filters, *, jsonl: Path, parquet: Path, rejected: Path) -> dict:
    dataset, rejected_rows = split_rows(generations, filters)
    write_jsonl(dataset, jsonl)
    write_table(dataset, DATASET_SCHEMA, parquet)
    write_jsonl(rejected_rows, rejected)
    return {"exported": len(dataset), "rejected": len(rejected_rows)}


def merge_datasets(paths: list[Path], out: Path) -> dict:
    """Concatenate category datasets into one file, keeping the first of identical token sequences."""
    seen: set[bytes] = set()
    kept = duplicates = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as dst:
        for path in paths:
            with open(path, encoding="utf-8") as src:
                for line in src:
                    row = json.loads(line)
                    digest = hashlib.sha256(json.dumps(row["input_ids"]).encode()).digest()
                    if digest in seen:
                        duplicates += 1
                        continue
                    seen.add(digest)
                    dst.write(line)
                    kept += 1
    tmp.replace(out)
    return {"rows": kept, "duplicates_dropped": duplicates}


def export_dataset(*, generations: Path, dataset: Path, dataset_parquet: Path, rejected: Path, export: dict) -> dict:
    """Export one category: trainer rows to `dataset` (+ Parquet), every row left out to `rejected`."""
    counts = export_category(
        read_rows(generations), Filters.from_config(export), jsonl=dataset, parquet=dataset_parquet, rejected=rejected
    )
    log.info("%s: %s", generations, counts)
    return counts


def merge_dataset(*, dataset: list[Path], train: Path) -> dict:
    """Merge every category's dataset into one train.jsonl, identical token sequences once."""
    counts = merge_datasets(dataset, train)
    log.info("merged %d files into %s: %s", len(dataset), train, counts)
    return counts
