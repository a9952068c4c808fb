"""Prompt files as containers: which files a path names (a file, a folder, a `datasets` folder), of
which kind, and their bytes, decompressed (.gz, .zst) a block at a time; the formats are `prompt_formats`'.

May import: `settings`, `storage.prompt_rows`; never the formats or the reading pass built on it.
"""

import codecs
import gzip
import itertools
import json
from pathlib import Path

from eagle3_datagen.storage.prompt_rows import short_repr


class PromptFileError(ValueError):
    """A prompt file that cannot be read as a whole (truncated array, wrong format, bad compression)."""


COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
COLUMNAR_SUFFIXES = (".parquet", ".arrow")


# Prompt files are read a block at a time: a file of any size (a 600 MB ShareGPT array, say) never
# sits in memory whole, as bytes, text or objects.
BLOCK = 1 << 20


def _zstd_blocks(fh):
    """Decompressed zstd data, frame after frame (pzstd, cat), in small pieces. Not zstandard's stream
    reader: it ends quietly where a truncated file ends; a decompression object says so."""
    import zstandard

    context = zstandard.ZstdDecompressor()
    frame, inside = context.decompressobj(), False
    while data := fh.read(1 << 14):
        while data:
            if out := frame.decompress(data):
                yield out
            if frame.eof:
                data, frame, inside = frame.unused_data, context.decompressobj(), False
            else:
                data, inside = b"", True
    if inside:
        raise EOFError("the file ends inside a zstd frame: it is truncated")


def read_blocks(path: Path):
    """The file's bytes, decompressed by its suffix (.gz, .zst), a block at a time; an unreadable
    stream is the file's error."""
    kind = COMPRESSIONS.get(path.suffix.lower())
    try:
        with open(path, "rb") as raw:
            if kind == "zstd":
                yield from _zstd_blocks(raw)
                return
            fh = gzip.open(raw, "rb") if kind == "gzip" else raw
            yield from iter(lambda: fh.read(BLOCK), b"")
    except Exception as exc:  # gzip.BadGzipFile, zstandard.ZstdError, EOFError, OSError, ...
        raise PromptFileError(
            f"{path}: cannot be read as {kind or 'uncompressed'} data: {type(exc).__name__}: {exc}"
        ) from None


def json_stream(path: Path):
    """(the text's first 20 bytes past white space, the whole byte stream) of a JSON or JSONL file,
    a UTF-8 byte order mark at the start (Windows editors write one) dropped."""
    blocks = read_blocks(path)
    head = b""
    for block in blocks:
        head += block
        if len(head) >= len(codecs.BOM_UTF8) and head.removeprefix(codecs.BOM_UTF8).lstrip():
            break
    head = head.removeprefix(codecs.BOM_UTF8)
    return head.lstrip()[:20], itertools.chain([head], blocks)


def split_lines(blocks):
    """The lines of a byte stream (without their newline), the last one also when it has none."""
    parts: list[bytes] = []
    for block in blocks:
        start = 0
        while (newline := block.find(b"\n", start)) != -1:
            parts.append(block[start:newline])
            yield b"".join(parts)
            parts, start = [], newline + 1
        parts.append(block[start:])
    if any(parts):
        yield b"".join(parts)


def folder_files(folder: Path) -> list[Path]:
    """The data files of a folder: those its `datasets` state.json names, or every supported one, by name."""
    state = folder / "state.json"
    if state.is_file():
        return _state_files(state)
    files = sorted(p for p in folder.iterdir() if p.is_file() and file_kind(p) is not None)
    if not files:
        raise PromptFileError(
            f"{folder}: a folder with no prompt files (JSONL, JSON, Parquet, Arrow, optionally .gz/.zst)"
        )
    return files


def _state_files(state: Path) -> list[Path]:
    """The files a `datasets` state.json names; one that cannot say fails the folder (others would be
    a different data set)."""
    try:
        data_files = json.loads(state.read_text(encoding="utf-8"))["_data_files"]
        names = [entry["filename"] for entry in data_files]
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise PromptFileError(f"{state}: cannot be read as JSON: {type(exc).__name__}: {exc}") from None
    except (KeyError, TypeError, AttributeError):
        raise PromptFileError(
            f'{state}: not a `datasets` state.json: expected {{"_data_files": [{{"filename": ...}}, ...]}}'
        ) from None
    files = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise PromptFileError(f"{state}: a `_data_files` filename is {short_repr(name)}, not a file name")
        if not (state.parent / name).is_file():
            raise PromptFileError(f"{state}: names {name!r} in `_data_files`, which is not in {state.parent}")
        files.append(state.parent / name)
    if not files:
        raise PromptFileError(f"{state}: `_data_files` names no files")
    return files


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in COMPRESSIONS:
        name = name.removesuffix(suffix)
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(COLUMNAR_SUFFIXES) and not COMPRESSIONS.get(path.suffix.lower()):
        return "columnar"
    return None
