"""Read prompt files into normalized conversations; every bad row becomes a reason, never an exception.

`iter_prompts` normalizes each record of a category's prompt file or folder, then samples, limits
(`max_rows`), checks for duplicate ids and deduplicates; `prompt_extent` sizes the input ahead.

May import: `settings`, `storage.prompt_rows`, `storage.prompt_files`, `storage.prompt_formats`.
"""

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.settings import stable_hash
from eagle3_datagen.storage.prompt_files import PromptFileError, file_kind, folder_files, json_stream, split_lines
from eagle3_datagen.storage.prompt_formats import JSON_COLUMNS, iter_records, record_batches
from eagle3_datagen.storage.prompt_rows import PromptRow, ReadOptions, RowError, normalize_row, valid_text

log = logging.getLogger(__name__)


def without_source(reason: str) -> str:
    """A row's reason without the file and line it begins with ("f.jsonl:12: field 'id': ...")."""
    return re.sub(r"^\S+?:(row )?\d+: ", "", reason)


def _given_id(obj, options: ReadOptions, fallback: str) -> str:
    """The id a row that is not used goes by in its record: its own, if it has a usable one."""
    raw_id = obj.get(options.id_field) if isinstance(obj, dict) else None
    usable = isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool)
    return str(raw_id) if usable and str(raw_id).strip() and valid_text(str(raw_id)) else fallback


def _fallback_id(source: str) -> str:
    """The id of a row known by its place only: "f-line-12" for "f.jsonl:12", "f-row-3" for "f.parquet:row 3"."""
    file, _, position = source.rpartition(":")
    place = position.replace("row ", "row-") if "row" in position else "line-" + position
    return f"{Path(file).name.split('.')[0]}-{place}"


def read_prompts(path: str | Path, options: ReadOptions | None = None) -> list[PromptRow]:
    """Every row of a prompt file as a list (`iter_prompts` streams them)."""
    return list(iter_prompts(path, options))


def iter_prompts(path: str | Path, options: ReadOptions | None = None) -> Iterator[PromptRow]:
    """Every row of a prompt file, in file order, streamed; unusable rows (sampled out too) carry a reason
    naming file, line, field. Whatever goes wrong with one row is its reason (an exception nobody
    foresaw: an `unexpected` row, its traceback logged); only a PromptFileError or a missing path ends
    the reading."""
    options = options or ReadOptions()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    rows = _Rows(options)
    json_columns = tuple(dict.fromkeys([*JSON_COLUMNS, *([options.messages_field] if options.messages_field else [])]))
    position_index = -1
    for position_index, (source, obj, error) in enumerate(iter_records(path, json_columns)):
        try:
            row = rows.row(position_index, source, obj, error)
        except Exception as exc:  # the one guard: nothing about one row ends the file
            row = _unexpected_row(source, obj, exc, options)
        if row.reason is not None and not valid_text(row.reason):  # a value quoted from the row
            row.reason = row.reason.encode("utf-8", "backslashreplace").decode("utf-8")
        yield row
    if position_index < 0:
        raise PromptFileError(f"prompts file {path} is empty: it holds no rows")


@dataclass(frozen=True)
class Extent:
    """How much a prompt file or folder holds, found without parsing it: `rows`, its records (None where
    a file is a JSON array), and `places`, each file's lines or rows in reading order."""

    rows: int | None
    places: dict[str, int]

    def fraction(self, source: str) -> float | None:
        """The share of the input read up to the record at `source` ("f.json:120", "f.parquet:row 3")."""
        file, _, place = source.rpartition(":")
        number = place.removeprefix("row ")
        if file not in self.places or not number.isdigit() or not sum(self.places.values()):
            return None
        names = list(self.places)
        before = sum(self.places[name] for name in names[: names.index(file)])
        return min((before + int(number)) / sum(self.places.values()), 1.0)


UNKNOWN_EXTENT = Extent(None, {})


def prompt_extent(path: str | Path) -> Extent:
    """The `Extent` of a prompt file or folder, from its bytes (JSON) or metadata (Parquet, Arrow); a file
    that cannot be read has none: the reading pass says what is wrong with it."""
    path = Path(path)
    try:
        rows: int | None = 0
        places: dict[str, int] = {}
        for file in folder_files(path) if path.is_dir() else [path]:
            records, places[str(file)] = _file_extent(file)
            rows = None if rows is None or records is None else rows + records
        return Extent(rows, places)
    except Exception as exc:
        log.info(
            "%s: the rows cannot be counted ahead (%s: %s); progress without a total", path, type(exc).__name__, exc
        )
        return UNKNOWN_EXTENT


def _file_extent(path: Path) -> tuple[int | None, int]:
    """(records or None, lines or rows) of one prompt file, as `iter_records` would read it."""
    kind = file_kind(path)
    if kind == "columnar":
        import pyarrow.parquet as pq

        parquet = path.suffix == ".parquet"
        rows = pq.read_metadata(path).num_rows if parquet else sum(b.num_rows for b in record_batches(path))
        return rows, rows
    if kind != "json":
        raise PromptFileError(f"{path}: unknown prompt file type")
    start, stream = json_stream(path)
    if start[:1] == b"[":  # one JSON array: its lines, counted as bytes
        return None, sum(block.count(b"\n") for block in stream) + 1
    lines = records = 0
    for line in split_lines(stream):
        lines += 1
        records += bool(line.strip())
    return records, lines


class _Rows:
    """One pass over a prompt file: each record to its PromptRow, remembering rows taken, ids and hashes."""

    def __init__(self, options: ReadOptions):
        self.options = options
        self.taken = 0
        self.first_seen: dict[str, str] = {}
        self.first_content: dict[str, str] = {}

    def row(self, position_index: int, source: str, obj, error) -> PromptRow:
        options = self.options
        fallback_id = _fallback_id(source)
        fraction, left_out = options.sample_fraction, None  # the sample: a seeded, stable draw per row
        if fraction is not None and int(stable_hash([options.seed, position_index])[:12], 16) / 16**12 >= fraction:
            left_out = f"not in the sample (sample_fraction {fraction}, seed {options.seed})"
        elif options.max_rows is not None and self.taken >= options.max_rows:
            left_out = f"past max_rows {options.max_rows}"
        if left_out is not None:
            return PromptRow(id=_given_id(obj, options, fallback_id), source=source, reason=f"{source}: {left_out}")
        self.taken += 1
        if isinstance(error, Exception):  # what the reader did not foresee: the guard's to report
            raise error
        if error is not None:
            return PromptRow(id=fallback_id, source=source, reason=f"{source}: {error}")
        try:
            row = normalize_row(obj, source=source, options=options)
        except RowError as exc:
            return PromptRow(id=_given_id(obj, options, fallback_id), source=source, reason=f"{source}: {exc}")
        if row.id in self.first_seen:
            row.reason = f"{source}: field 'id': duplicate id {row.id!r} (first seen at {self.first_seen[row.id]})"
        else:
            self.first_seen[row.id] = source
            if options.dedup:
                content = stable_hash([row.messages, row.tools])
                if content in self.first_content:
                    row.reason = f"{source}: the same conversation as {self.first_content[content]!r} (dedup)"
                else:
                    self.first_content[content] = row.id
        return row


def _unexpected_row(source: str, obj, exc: Exception, options: ReadOptions) -> PromptRow:
    """A row skipped by an exception nobody foresaw: logged with its traceback, once, and marked."""
    log.error("%s: unexpected error, the row is skipped (a possible bug)", source, exc_info=exc)
    try:
        row_id = _given_id(obj, options, _fallback_id(source))
    except Exception:
        row_id = _fallback_id(source)
    try:
        error = f"{type(exc).__name__}: {exc}"
    except Exception:
        error = type(exc).__name__
    error = error[:300] + "..." if len(error) > 300 else error
    return PromptRow(
        id=row_id,
        source=source,
        reason=f"{source}: unexpected error (a possible bug; the traceback is in the log): {error}",
        unexpected=True,
    )
