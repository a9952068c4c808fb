"""Parquet tables of the pipeline: explicit Arrow schemas (token ids `list<int32>`), run provenance in
the metadata, read and written in bounded batches (`Batching`) so that no category is ever held whole."""

import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle3_datagen.storage.disk import WholeFile
from eagle3_datagen.storage.progress import INTERVAL_S, Progress

IDS = pa.list_(pa.int32())

PROMPTS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        # The serving mode the row is rendered and sampled in (model.modes; "default" without modes).
        ("mode", pa.string()),
        ("category", pa.string()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("messages_sha256", pa.string()),
        ("prompt_ids", IDS),
        # Where each regenerated turn's history ends in `messages` (one entry per turn; prompt_ids
        # are the first turn's prompt). turns: last has one entry, the whole conversation.
        ("turn_ends", IDS),
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
        ("turn", pa.int32()),
        ("mode", pa.string()),
        ("category", pa.string()),
        # The turn's prompt as messages (later turns: with the model's own earlier answers) and tools.
        ("messages", pa.string()),
        # What that history holds: on_policy (the model's own answers only) or original (an original
        # answer stands where the model's tool calls diverged: config tool_divergence); null: not made.
        ("history", pa.string()),
        ("tools", pa.string()),
        ("prompt_ids", IDS),
        ("output_ids", IDS),
        ("finish_type", pa.string()),
        ("finish_matched", pa.string()),
        ("completion_tokens", pa.int32()),
        ("cached_tokens", pa.int32()),
        ("e2e_latency", pa.float64()),
        # The server's load as the answer reports it: KV-cache retractions, and seconds queued
        # (SGLang reports queue_time only with --enable-metrics: 0 without).
        ("num_retractions", pa.int32()),
        ("queue_time", pa.float64()),
        ("sampling", pa.string()),
        ("seed", pa.int64()),
        ("max_new_tokens", pa.int32()),
        ("attempts", pa.int32()),
        # Where each continuation of a streamed answer cut short began (empty: sent once, whole).
        ("resumed_at", IDS),
        ("status", pa.string()),
        ("error", pa.string()),
    ]
)

PROVENANCE_KEY = b"eagle3_datagen.provenance"


@dataclass(frozen=True)
class Batching:
    """How many rows a step holds at once (config `batch`): at most `rows` rows and (beyond the first
    row) `tokens` token ids."""

    rows: int = 1024
    tokens: int = 2_000_000

    @classmethod
    def from_config(cls, batch: dict | None = None) -> "Batching":
        from eagle3_datagen.settings import defaults

        return cls(**defaults("batch", **(batch or {})))


DEFAULT_BATCHING = Batching()


def iter_record_batches(
    path: str | Path, batching: Batching = DEFAULT_BATCHING, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """A table's rows as Arrow record batches, in order, each within `batching` (one row at least)."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batching.rows, columns=columns):
        counts = np.zeros(batch.num_rows, dtype=np.int64)  # token ids per row, over the list columns
        for column in batch.columns:
            if pa.types.is_list(column.type):
                counts += pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
        start, tokens = 0, 0
        for i, n in enumerate(counts):
            if i > start and tokens + n > batching.tokens:
                yield batch.slice(start, i - start)
                start, tokens = i, 0
            tokens += n
        if start < batch.num_rows:
            yield batch.slice(start, batch.num_rows - start)


def iter_batches(
    path: str | Path, batching: Batching = DEFAULT_BATCHING, columns: list[str] | None = None
) -> Iterator[list[dict]]:
    """A table's rows as lists of dicts, in order, each list within `batching`."""
    return (batch.to_pylist() for batch in iter_record_batches(path, batching, columns))


def iter_rows(
    path: str | Path, batching: Batching = DEFAULT_BATCHING, columns: list[str] | None = None
) -> Iterator[dict]:
    """A table's rows one by one, read a batch at a time."""
    return itertools.chain.from_iterable(iter_batches(path, batching, columns))


def logged(batches: Iterable, total: int, label: str, interval_s: float = INTERVAL_S) -> Iterator:
    """The batches (lists, or pairs of lists) as they come, with progress lines (`progress.Progress`,
    logger `label`): a step that takes an hour says how far it is."""
    progress = Progress(label, total, interval_s=interval_s)
    progress.start()
    for batch in batches:
        yield batch
        progress.advance(len(batch[0] if isinstance(batch, tuple) else batch))
    progress.finish()


def count_rows(path: str | Path) -> int:
    return pq.read_metadata(path).num_rows


class TableWriter(WholeFile):
    """Rows written to Parquet a batch at a time, whole or not at all (`disk.WholeFile`), with the
    provenance added at the end, when all of it is known."""

    what = "table"
    advice = "nothing of it is kept; free space on {mount}, then rerun"

    def __init__(self, path: str | Path, schema: pa.Schema, batching: Batching = DEFAULT_BATCHING):
        super().__init__(path)
        self.schema = schema
        self.batching = batching
        self._list_columns = [f.name for f in schema if pa.types.is_list(f.type)]
        self._buffer: list[dict] = []
        self._buffered_tokens = 0
        self.rows = 0
        with self.guarded():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = pq.ParquetWriter(self.tmp, schema, compression="zstd")

    def write(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self._buffer.append(row)
            self._buffered_tokens += sum(len(row.get(name) or ()) for name in self._list_columns)
            self.rows += 1
            if len(self._buffer) >= self.batching.rows or self._buffered_tokens >= self.batching.tokens:
                self.flush()

    def write_arrow(self, table: pa.Table) -> None:
        """Rows that are already Arrow (a slice of another table of this schema), as they are."""
        self.flush()
        with self.guarded():
            self._handle.write_table(table.replace_schema_metadata(None))
        self.rows += table.num_rows

    def flush(self) -> None:
        if self._buffer:
            with self.guarded():
                self._handle.write_table(pa.Table.from_pylist(self._buffer, schema=self.schema))
            self._buffer, self._buffered_tokens = [], 0

    def close(self, provenance: dict | None = None) -> None:
        self.flush()
        if provenance is not None:
            with self.guarded():
                self._handle.add_key_value_metadata({PROVENANCE_KEY: json.dumps(provenance, sort_keys=True).encode()})
        super().close()


def write_table(rows: list[dict], schema: pa.Schema, path: str | Path, provenance: dict | None = None) -> None:
    """Write rows whole or not at all (`TableWriter`)."""
    with TableWriter(path, schema) as writer:
        writer.write(rows)
        writer.close(provenance)


def read_rows(path: str | Path) -> list[dict]:
    """A whole table as dicts: for small tables and tests; the steps stream (`iter_batches`)."""
    return pq.read_table(path).to_pylist()


def read_provenance(path: str | Path) -> dict:
    meta = pq.read_metadata(path).metadata or {}
    blob = meta.get(PROVENANCE_KEY)
    return json.loads(blob) if blob else {}
