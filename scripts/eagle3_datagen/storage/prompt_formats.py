"""Prompt file formats read into records `(where, parsed object or None, error)`: JSON lines, JSON arrays
(streamed), Parquet and Arrow (a batch at a time). One bad line or row is its own error, never the file's.

May import: `settings`, `storage.prompt_rows`, `storage.prompt_files`; never `storage.prompts`, the pass
built on this module.
"""

import codecs
import json
import re
from pathlib import Path

from eagle3_datagen.storage import prompt_files  # its BLOCK, read at call time (tests set it small)
from eagle3_datagen.storage.prompt_files import PromptFileError, file_kind, folder_files, json_stream, split_lines


def _loads(text: str, column: bool):
    """(parsed object, None), or (None, why the text is not JSON that can be read)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"malformed JSON: {exc.msg}" + (f" at column {exc.colno}" if column else "")
    except RecursionError:
        return None, "JSON nested too deeply to read (past Python's recursion limit)"
    except ValueError as exc:  # an integer of more than 4300 digits
        return None, f"JSON that cannot be read: {exc}"


def _iter_jsonl_lines(lines, where):
    """(where, parsed object or None, error) for each non-blank line of JSONL. The error is text for
    a line that is not JSON, or the exception nobody foresaw: one line never ends the file."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield where(number), None, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
            continue
        try:
            yield where(number), *_loads(text, column=True)
        except Exception as exc:
            yield where(number), None, exc


class _Text:
    """Text of a UTF-8 byte stream, decoded a block at a time, with line and column bookkeeping
    for a reader that moves forward through it (`buf[pos:]` is what is left to read)."""

    def __init__(self, path: Path, blocks):
        self.path = path
        self.blocks = iter(blocks)
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.line, self.col = 1, 1  # of buf[0]
        self.counted = 0  # buf[:counted] is included in line_at's running count
        self.counted_line = 1

    def more(self) -> bool:
        """Read the next block; False at the end of the stream."""
        if self.eof:
            return False
        block = next(self.blocks, None)
        try:
            text = self.decoder.decode(block or b"", final=block is None)
        except UnicodeDecodeError as exc:
            line = self.line + self.buf.count("\n") + (block or b"").count(b"\n", 0, exc.start)
            raise PromptFileError(
                f"{self.path}: not valid UTF-8 at line {line} (byte 0x{exc.object[exc.start : exc.start + 1].hex()}); "
                "the JSON array cannot be read"
            ) from None
        self.eof = block is None
        if self.pos > prompt_files.BLOCK:  # drop what was read, keeping line and column of the new start
            self.line_at(self.pos)
            last = self.buf.rfind("\n", 0, self.pos)
            self.col = self.pos - last if last != -1 else self.col + self.pos
            self.line, self.counted, self.counted_line = self.counted_line, 0, self.counted_line
            self.buf, self.pos = self.buf[self.pos :], 0
        self.buf += text
        return True

    def skip_space(self) -> str:
        """Move past whitespace; the next character, or "" at the end of the text."""
        while True:
            self.pos = WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def line_at(self, pos: int) -> int:
        self.counted_line += self.buf.count("\n", self.counted, pos)
        self.counted = pos
        return self.counted_line

    def where(self, pos: int) -> str:
        """'line L column C' of a position in the buffer."""
        line = self.line + self.buf.count("\n", 0, pos)
        last = self.buf.rfind("\n", 0, pos)
        col = pos - last if last != -1 else self.col + pos
        return f"line {line} column {col}"


WHITESPACE = re.compile(r"\s*")
NUMBER_CHARS = re.compile(r"[0-9.eE+-]*")


def _iter_json_array(path: Path, blocks):
    """Each element of a JSON array (pretty-printed or not), named by the line it starts on.

    A JSON array cannot be read past a broken element, so a malformed or truncated array fails the
    whole file (the tokenize job writes nothing), naming where reading stopped."""
    decoder = json.JSONDecoder()
    text = _Text(path, blocks)
    text.skip_space()
    text.pos += 1  # past "["
    n, following = 0, ","
    if text.skip_space() == "]":  # an empty array
        text.pos, following = text.pos + 1, "]"
    while following == ",":
        text.skip_space()
        while True:
            try:
                obj, end = decoder.raw_decode(text.buf, text.pos)
                # A number whose characters run to the block's end may go on ("0" of "0.5", "1" of
                # "1e5"): it is decoded again with the next block.
                if text.eof or NUMBER_CHARS.match(text.buf, end).end() < len(text.buf):
                    break
            except json.JSONDecodeError as exc:
                if text.eof:
                    raise PromptFileError(
                        f"{path}: the JSON array breaks off at {text.where(exc.pos)} ({exc.msg}) after {n} "
                        "complete elements; nothing of the file was used"
                    ) from None
            except (RecursionError, ValueError) as exc:  # deep nesting, an integer over 4300 digits
                problem = "nested too deeply to read" if isinstance(exc, RecursionError) else str(exc)
                raise PromptFileError(
                    f"{path}: element {n + 1} of the JSON array, at {text.where(text.pos)}, cannot be read "
                    f"({problem}); an array cannot be read past it, so nothing of the file was used"
                ) from None
            # Decoded again only once the unread text has doubled: an element of many blocks (a
            # 100 MB conversation) costs a few decodes, not one per block (quadratic time).
            unread = len(text.buf) - text.pos
            while text.more() and len(text.buf) - text.pos < 2 * unread:
                pass
        n += 1
        yield f"{path}:{text.line_at(text.pos)}", obj, None
        text.pos = end
        following = text.skip_space()
        if following not in (",", "]"):
            raise PromptFileError(
                f"{path}: the JSON array breaks off at {text.where(text.pos).split(' column')[0]} (expected ',' or "
                f"']') after {n} complete elements; nothing of the file was used"
            )
        text.pos += 1
    if text.skip_space():
        raise PromptFileError(
            f"{path}: text after the JSON array at {text.where(text.pos).split(' column')[0]}: "
            f"{text.buf[text.pos : text.pos + 20]!r}; is it several arrays, or JSON lines?"
        )


def _iter_json_file(path: Path):
    """JSONL, or one JSON array (what ShareGPT-style files are), whatever the suffix says."""
    start, stream = json_stream(path)
    if start[:1] == b"[":
        yield from _iter_json_array(path, stream)
    elif start[:1] in (b"{", b""):
        yield from _iter_jsonl_lines(split_lines(stream), lambda number: f"{path}:{number}")
    else:
        raise PromptFileError(
            f"{path}: neither JSON lines nor a JSON array: it starts with {start!r} (expected '{{' or '[')"
        )


JSON_COLUMNS = ("messages", "conversations", "tools")


def _decode_json_columns(record: dict, json_columns=JSON_COLUMNS):
    """Conversation columns stored as JSON text, parsed; an error names the field."""
    for key, value in record.items():
        if isinstance(value, str) and key in json_columns and value[:1] in ("[", "{"):
            record[key], error = _loads(value, column=False)
            if error:
                return f"field '{key}': {error}"
    return None


def _batch_records(batch):
    """(record or None, error or None) for each row of a record batch. A value Arrow cannot give
    Python (a date past year 9999, invalid UTF-8 from a careless writer) is its row's error, naming
    the column, and the batch's other rows are still read."""
    try:
        yield from ((record, None) for record in batch.to_pylist())
        return
    except Exception:  # found again below, row by row, with the column it is in
        pass
    columns = list(zip(batch.schema.names, batch.columns))
    for i in range(batch.num_rows):
        record, error = {}, None
        for name, column in columns:
            try:
                record[name] = column[i].as_py()
            except Exception as exc:
                error = f"field '{name}': its {column.type} value cannot be read: {type(exc).__name__}: {exc}"
                break
        yield (None, error) if error else (record, None)


def _iter_columnar(path: Path, json_columns=JSON_COLUMNS):
    """Rows of a Parquet or Arrow file, a record batch at a time."""
    number = 0
    for batch in record_batches(path):
        for record, error in _batch_records(batch):
            number += 1
            if error is None:
                try:
                    error = _decode_json_columns(record, json_columns)
                except Exception as exc:
                    error = exc
            yield f"{path}:row {number}", None if error else record, error


def record_batches(path: Path):
    """The record batches of a Parquet or Arrow file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            yield from pq.ParquetFile(path).iter_batches(batch_size=1024)
            return
        with pa.memory_map(str(path)) as source:  # `datasets` writes Arrow IPC streams
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
                return
            yield from reader
    except Exception as exc:
        raise PromptFileError(f"{path}: cannot be read as {path.suffix[1:]}: {type(exc).__name__}: {exc}") from None


def iter_records(path: Path, json_columns=JSON_COLUMNS):
    """(where: file and line or row, parsed object or None, error) for every row of a prompt file or
    folder; `json_columns`: the Parquet and Arrow columns parsed where they hold JSON text. A file
    that cannot be read whole is a PromptFileError."""
    if path.is_dir():
        for file in folder_files(path):
            yield from iter_records(file, json_columns)
        return
    kind = file_kind(path)
    if kind == "json":
        yield from _iter_json_file(path)
    elif kind == "columnar":
        yield from _iter_columnar(path, json_columns)
    else:
        raise PromptFileError(
            f"{path}: unknown prompt file type; use .jsonl, .json (lines or one array), .parquet, .arrow, "
            "optionally compressed (.gz, .zst), or a folder of them (a `datasets` save_to_disk folder too)"
        )
