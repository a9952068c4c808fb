"""Parquet tables of the pipeline, with explicit Arrow schemas and run-level provenance in the metadata.

Token ids are `list<int32>` everywhere, so that what a file holds is exactly what was generated.
"""

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

IDS = pa.list_(pa.int32())

PROMPTS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        ("category", pa.string()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("messages_sha256", pa.string()),
        ("prompt_ids", IDS),
        ("n_prompt_tokens", pa.int32()),
        ("max_new_tokens", pa.int32()),
        ("seed", pa.int64()),
        ("status", pa.string()),
        ("reason", pa.string()),
    ]
)

GENERATIONS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        ("category", pa.string()),
        ("prompt_ids", IDS),
        ("output_ids", IDS),
        ("finish_type", pa.string()),
        ("finish_matched", pa.string()),
        ("completion_tokens", pa.int32()),
        ("cached_tokens", pa.int32()),
        ("e2e_latency", pa.float64()),
        ("sampling", pa.string()),
        ("seed", pa.int64()),
        ("max_new_tokens", pa.int32()),
        ("attempts", pa.int32()),
        ("status", pa.string()),
        ("error", pa.string()),
    ]
)

PROVENANCE_KEY = b"eagle3_datagen.provenance"


def write_table(rows: list[dict], schema: pa.Schema, path: str | Path, provenance: dict | None = None) -> None:
    """Write rows atomically (temp file, then rename) so a killed job never leaves a half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=schema)
    if provenance is not None:
        meta = dict(schema.metadata or {})
        meta[PROVENANCE_KEY] = json.dumps(provenance, sort_keys=True).encode("utf-8")
        table = table.replace_schema_metadata(meta)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def read_rows(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def read_provenance(path: str | Path) -> dict:
    meta = pq.read_schema(path).metadata or {}
    blob = meta.get(PROVENANCE_KEY)
    return json.loads(blob) if blob else {}
