"""Read prompt files into normalized conversations; every bad row becomes a reason, never an exception.

Input rows are JSONL (or Parquet) with one conversation each, in OpenAI message form
(`{"id", "messages": [{"role", "content"}], "tools"?}`) or ShareGPT form (`"conversations"` with
`from`/`value`). A trailing assistant message is dropped: it is what gets regenerated (DESIGN §2).

One guard in `iter_prompts` turns whatever goes wrong with one row into that row's reason: a
`RowError` for the problems foreseen here, any other exception as an `unexpected` row whose
traceback is logged (a possible bug, counted and limited by the tokenize step). Only a file that
cannot be read as a whole is a `PromptFileError`.
"""

import codecs
import hashlib
import itertools
import json
import logging
import math
import re
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_datagen.settings import stable_hash

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


# The standard speakers of ShareGPT; any other known one (chatgpt, bing, bard, model, ...) is mapped
# and counted as `speakers_mapped`.
SHAREGPT_STANDARD = {"system", "human", "gpt", "tool"}


def without_source(reason: str) -> str:
    """A row's reason without the file and line it begins with ("f.jsonl:12: field 'id': ...")."""
    return re.sub(r"^\S+?:(row )?\d+: ", "", reason)


@dataclass
class ReadOptions:
    """How to read one category's prompt file (per-category columns of the sheet)."""

    messages_field: str | None = None  # the field holding the conversation (default: messages, else conversations)
    id_field: str = "id"
    system_prompt: str | None = None  # added where a conversation has no system message
    max_rows: int | None = None
    sample_fraction: float | None = None
    seed: int = 0
    dedup: bool = False  # the same normalized conversation (and tools) is used once

    @classmethod
    def from_category(cls, category: dict, seed: int) -> "ReadOptions":
        def cell(key):
            value = category.get(key)
            return None if value is None or value != value or value == "" else value

        return cls(
            messages_field=cell("messages_field"),
            id_field=cell("id_field") or "id",
            system_prompt=cell("system_prompt"),
            max_rows=int(cell("max_rows")) if cell("max_rows") is not None else None,
            sample_fraction=float(cell("sample_fraction")) if cell("sample_fraction") is not None else None,
            seed=seed,
            dedup=str(cell("dedup")).lower() in ("true", "1", "yes") if cell("dedup") is not None else False,
        )


@dataclass
class PromptRow:
    """One input conversation, normalized; `reason` is set when the row cannot be used."""

    id: str
    source: str
    messages: list = field(default_factory=list)
    tools: list | None = None
    dropped_assistant: bool = False
    reason: str | None = None
    # What normalization changed, counted per category in the summary (ShareGPT's quirks).
    fixes: dict = field(default_factory=dict)
    # Skipped by an exception nobody foresaw (not a RowError): possibly a bug, so counted apart.
    unexpected: bool = False

    @property
    def ok(self) -> bool:
        return self.reason is None


class RowError(ValueError):
    """A problem with one field of one row; the message names the field."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"field '{field_name}': {problem}")


# A value quoted in a reason stays short and shallow: a row's whole text in every reason would bloat
# the table, and repr of a deeply nested value can itself exceed the recursion limit.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


def _short(value) -> str:
    return _REPR.repr(value)


def _valid_text(text: str) -> bool:
    """Whether a string is valid Unicode: JSON's "\ud800" escape gives a lone surrogate, which no
    UTF-8 writer (hashing, the Rust tokenizer, Parquet) accepts."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RowError(
            where, f"invalid Unicode: a lone surrogate {text[exc.start]!r} at character {exc.start + 1}"
        ) from None


def _check_json(value, where: str) -> None:
    """Refuse a value that the prompts table cannot hold as JSON text and hash: bytes, dates and
    decimals (Parquet and Arrow rows carry them), NaN and infinities (no JSON number), lone
    surrogates, nesting past the recursion limit. The error names the field path."""
    try:
        # sort_keys as canonical_json does: object keys of mixed types fail here, not when hashed.
        json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True).encode("utf-8")
        return
    except RecursionError:
        raise RowError(where, "nested too deeply to be written as JSON") from None
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        error = exc
    stack = [(value, where)]  # a walk to name the first offending field
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise RowError(path, f"{value} is not a JSON number")
        elif isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise RowError(path, f"an object key of type {type(key).__name__}: {_short(key)}")
                _check_text(key, f"{path} (a key)")
            stack.extend((v, f"{path}.{k}") for k, v in reversed(value.items()))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(value))))
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise RowError(
                path, f"a {type(value).__name__} value ({_short(value)}), which JSON has no form for; store it as text"
            )
    raise RowError(where, f"cannot be written as JSON: {type(error).__name__}: {error}")


def _content_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        _check_text(content, where)
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RowError(f"{where}[{i}]", "only {'type': 'text', 'text': ...} parts are supported")
            _check_text(part["text"], f"{where}[{i}].text")
            parts.append(part["text"])
        return "".join(parts)
    raise RowError(where, f"expected a string or a list of text parts, got {type(content).__name__}")


def _normalize_message(raw, index: int, sharegpt: bool) -> dict:
    where = f"{'conversations' if sharegpt else 'messages'}[{index}]"
    if not isinstance(raw, dict):
        raise RowError(where, f"expected an object, got {type(raw).__name__}")
    if sharegpt:
        speaker = raw.get("from")
        if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:  # a list or dict is unhashable
            raise RowError(
                f"{where}.from", f"unknown speaker {_short(speaker)} (expected one of {', '.join(SHAREGPT_ROLES)})"
            )
        message = {"role": SHAREGPT_ROLES[speaker], "content": raw.get("value")}
        content_field = f"{where}.value"
        for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            if key in raw:
                message[key] = raw[key]
    else:
        role = raw.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RowError(f"{where}.role", f"unknown role {_short(role)} (expected one of {', '.join(ROLES)})")
        message = {
            k: v
            for k, v in raw.items()
            if k in ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
        }
        content_field = f"{where}.content"
    role = message["role"]
    text = _content_text(message.get("content"), content_field)
    message["content"] = text
    for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
        if key in message:  # carried as they are into the table's JSON and the chat template
            _check_json(message[key], f"{where}.{key}")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise RowError(f"{where}.tool_calls", f"only assistant messages carry tool_calls, not {role}")
        if not isinstance(tool_calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in tool_calls
        ):
            raise RowError(
                f"{where}.tool_calls",
                "expected a list of {'id', 'type': 'function', 'function': {'name', 'arguments'}}",
            )
    if role in ("system", "user", "tool") and not text.strip():
        raise RowError(content_field, "empty content")
    if role == "assistant" and not text.strip() and not tool_calls:
        raise RowError(content_field, "empty assistant message without tool_calls")
    if role == "tool" and "tool_call_id" not in message:
        raise RowError(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
    return message


def normalize_row(obj, *, source: str, options: ReadOptions | None = None) -> PromptRow:
    """Normalize one parsed input object. Raises RowError for an unusable row (id still derived)."""
    options = options or ReadOptions()
    if not isinstance(obj, dict):
        raise RowError("<row>", f"expected a JSON object, got {type(obj).__name__}")
    raw_id = obj.get(options.id_field)
    if raw_id is None:
        row_id = _content_id(obj)
    elif (
        isinstance(raw_id, (str, int))
        and not isinstance(raw_id, bool)
        and str(raw_id).strip()
        and "\n" not in str(raw_id)
    ):
        row_id = str(raw_id)
        _check_text(row_id, options.id_field)
    else:
        raise RowError(options.id_field, f"expected a non-empty single-line string or integer, got {_short(raw_id)}")
    row = PromptRow(id=row_id, source=source)
    if options.messages_field:
        key = options.messages_field
        raw_messages = obj.get(key)
        sharegpt = (
            isinstance(raw_messages, list)
            and bool(raw_messages)
            and isinstance(raw_messages[0], dict)
            and "from" in raw_messages[0]
        )
    else:
        sharegpt = "messages" not in obj and "conversations" in obj
        key = "conversations" if sharegpt else "messages"
        raw_messages = obj.get(key)
    if raw_messages is None:
        expected = repr(options.messages_field) if options.messages_field else "'messages' or ShareGPT 'conversations'"
        raise RowError(key, f"missing (expected {expected})")
    if not isinstance(raw_messages, list):
        raise RowError(key, f"expected a list, got {type(raw_messages).__name__}")
    if not raw_messages:
        raise RowError(key, "empty conversation")
    messages = [_normalize_message(m, i, sharegpt) for i, m in enumerate(raw_messages)]
    if sharegpt:
        messages = _sharegpt_fixes(raw_messages, messages, row.fixes)
        if not messages:  # about 1% of real ShareGPT: one assistant turn and nothing it answers
            raise RowError(key, "nothing to answer: only assistant turns, dropped as leading turns that answer nothing")
    if options.system_prompt and messages and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": options.system_prompt})
        row.fixes["system_prompt_added"] = 1
    tools = obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RowError("tools", f"expected a list of tool objects, got {type(tools).__name__}")
        _check_json(tools, "tools")
        tools = tools or None
    if messages and messages[-1]["role"] == "assistant":
        messages = messages[:-1]
        row.dropped_assistant = True
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise RowError(key, "nothing to answer: the conversation must end with a user or tool message")
    row.messages = messages
    row.tools = tools
    return row


def _content_id(obj: dict) -> str:
    """The id of a row without one: the hash of its canonical JSON. Values JSON has no form for
    (a Parquet timestamp, bytes) count by their repr, and invalid Unicode as it is: a column the
    row does not use must not make it unusable."""
    try:
        return "sha256-" + stable_hash(obj)[:16]
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        pass
    try:
        text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError) as exc:
        raise RowError("<row>", f"no id, and the row cannot be hashed for one: {type(exc).__name__}: {exc}") from None
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class PromptFileError(ValueError):
    """A prompt file that cannot be read as a whole (truncated array, wrong format, bad compression)."""


COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
COLUMNAR_SUFFIXES = (".parquet", ".arrow")


# Prompt files are read a block at a time: a file of any size (a 600 MB ShareGPT array, say) never
# sits in memory whole, as bytes, text or objects.
BLOCK = 1 << 20


def _zstd_blocks(fh):
    """Decompressed zstd data. zstandard's stream reader ends quietly where a truncated file ends,
    which would lose the rest of the file unnoticed; a decompression object says whether its frame
    was complete. Frames one after another (pzstd, cat) are read on. The input goes in small pieces
    so that a highly compressed file does not unfold into memory at once."""
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


def _blocks(path: Path):
    """The file's bytes, decompressed by its suffix (.gz, .zst), a block at a time; an unreadable
    stream is the file's error."""
    kind = COMPRESSIONS.get(path.suffix.lower())
    try:
        with open(path, "rb") as raw:
            if kind == "zstd":
                yield from _zstd_blocks(raw)
                return
            if kind == "gzip":
                import gzip

                fh = gzip.open(raw, "rb")
            else:
                fh = raw
            while block := fh.read(BLOCK):
                yield block
    except Exception as exc:  # gzip.BadGzipFile, zstandard.ZstdError, EOFError, OSError, ...
        raise PromptFileError(
            f"{path}: cannot be read as {kind or 'uncompressed'} data: {type(exc).__name__}: {exc}"
        ) from None


def _lines(blocks):
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


def _sharegpt_fixes(raw: list, messages: list[dict], fixes: dict) -> list[dict]:
    """ShareGPT's quirks, each by one stated rule and counted:

    - speakers other than human/gpt/system/tool that are known (chatgpt, bing, bard, model, ...) are
      mapped to their role (`speakers_mapped`, per turn);
    - assistant turns before the first user turn are dropped, as SpecForge does: there is nothing
      they answer (`leading_assistant_dropped`, per turn);
    - consecutive turns of one speaker (user, or assistant without tool calls) become one message,
      their texts joined by a blank line (`same_speaker_merged`, per turn merged away).
    """
    mapped = sum(1 for m in raw if isinstance(m, dict) and m.get("from") not in SHAREGPT_STANDARD)
    if mapped:
        fixes["speakers_mapped"] = mapped
    start = 1 if messages and messages[0]["role"] == "system" else 0
    lead = 0
    while start + lead < len(messages) and messages[start + lead]["role"] == "assistant":
        lead += 1
    if lead:
        fixes["leading_assistant_dropped"] = lead
        messages = messages[:start] + messages[start + lead :]
    out: list[dict] = []
    merged = 0
    for m in messages:
        prev = out[-1] if out else None
        plain = m["role"] in ("user", "assistant") and not m.get("tool_calls")
        if prev is not None and plain and prev["role"] == m["role"] and not prev.get("tool_calls"):
            out[-1] = dict(prev, content=f"{prev['content']}\n\n{m['content']}")
            merged += 1
        else:
            out.append(m)
    if merged:
        fixes["same_speaker_merged"] = merged
    return out


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
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            yield where(number), None, f"malformed JSON: {exc.msg} at column {exc.colno}"
        except RecursionError:
            yield where(number), None, "JSON nested too deeply to read (past Python's recursion limit)"
        except ValueError as exc:  # an integer of more than 4300 digits
            yield where(number), None, f"JSON that cannot be read: {exc}"
        except Exception as exc:
            yield where(number), None, exc
        else:
            yield where(number), obj, None


class _Text:
    """Text of a UTF-8 byte stream, decoded a block at a time, with line and column bookkeeping
    for a reader that moves forward through it (`buf[pos:]` is what is left to read)."""

    def __init__(self, path: Path, blocks):
        import codecs

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
        if self.pos > BLOCK:  # drop what was read, keeping line and column of the new start
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
    n = 0
    if text.skip_space() == "]":
        text.pos += 1
    else:
        while True:
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
            if following == ",":
                text.pos += 1
                continue
            if following == "]":
                text.pos += 1
                break
            raise PromptFileError(
                f"{path}: the JSON array breaks off at {text.where(text.pos).split(' column')[0]} (expected ',' or "
                f"']') after {n} complete elements; nothing of the file was used"
            )
    if text.skip_space():
        raise PromptFileError(
            f"{path}: text after the JSON array at {text.where(text.pos).split(' column')[0]}: "
            f"{text.buf[text.pos : text.pos + 20]!r}; is it several arrays, or JSON lines?"
        )


def _iter_json_file(path: Path):
    """JSONL, or one JSON array (what ShareGPT-style files are), whatever the suffix says. A UTF-8
    byte order mark at the start (Windows editors write one) is dropped."""
    blocks = _blocks(path)
    head = b""
    for block in blocks:
        head += block
        if len(head) >= len(codecs.BOM_UTF8) and head.removeprefix(codecs.BOM_UTF8).lstrip():
            break
    head = head.removeprefix(codecs.BOM_UTF8)
    first = head.lstrip()[:1]
    stream = itertools.chain([head], blocks)
    if first == b"[":
        yield from _iter_json_array(path, stream)
    elif first in (b"{", b""):
        yield from _iter_jsonl_lines(_lines(stream), lambda number: f"{path}:{number}")
    else:
        raise PromptFileError(
            f"{path}: neither JSON lines nor a JSON array: it starts with {head.lstrip()[:20]!r} (expected '{{' or '[')"
        )


JSON_COLUMNS = ("messages", "conversations", "tools")


def _decode_json_columns(record: dict, json_columns=JSON_COLUMNS):
    """Conversation columns stored as JSON text, parsed; an error names the field."""
    for key, value in record.items():
        if isinstance(value, str) and key in json_columns and value[:1] in ("[", "{"):
            try:
                record[key] = json.loads(value)
            except json.JSONDecodeError as exc:
                return f"field '{key}': malformed JSON: {exc.msg}"
            except RecursionError:
                return f"field '{key}': JSON nested too deeply to read (past Python's recursion limit)"
            except ValueError as exc:  # an integer of more than 4300 digits
                return f"field '{key}': JSON that cannot be read: {exc}"
    return None


def _batch_records(batch):
    """(record or None, error or None) for each row of a record batch. A value Arrow cannot give
    Python (a date past year 9999, invalid UTF-8 from a careless writer) is its row's error, naming
    the column, and the batch's other rows are still read."""
    try:
        records = batch.to_pylist()
    except Exception:  # found again below, row by row, with the column it is in
        records = None
    if records is not None:
        yield from ((record, None) for record in records)
        return
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
    for batch in _record_batches(path):
        for record, error in _batch_records(batch):
            number += 1
            if error is None:
                try:
                    error = _decode_json_columns(record, json_columns)
                except Exception as exc:
                    error = exc
            yield f"{path}:row {number}", None if error else record, error


def _record_batches(path: Path):
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
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)
                return
            yield from reader
    except Exception as exc:
        raise PromptFileError(f"{path}: cannot be read as {path.suffix[1:]}: {type(exc).__name__}: {exc}") from None


def _prompt_files(folder: Path) -> list[Path]:
    """The data files of a folder: a `datasets` save_to_disk folder (state.json names them), or
    every supported file in it, in name order."""
    state = folder / "state.json"
    if state.is_file():
        return _state_files(state)
    files = sorted(p for p in folder.iterdir() if p.is_file() and _kind(p) is not None)
    if not files:
        raise PromptFileError(
            f"{folder}: a folder with no prompt files (JSONL, JSON, Parquet, Arrow, optionally .gz/.zst)"
        )
    return files


def _state_files(state: Path) -> list[Path]:
    """The files a `datasets` state.json names in `_data_files`; a state.json that cannot say which
    fails the folder, since reading some other set of files would be a different data set."""
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
            raise PromptFileError(f"{state}: a `_data_files` filename is {_short(name)}, not a file name")
        if not (state.parent / name).is_file():
            raise PromptFileError(f"{state}: names {name!r} in `_data_files`, which is not in {state.parent}")
        files.append(state.parent / name)
    if not files:
        raise PromptFileError(f"{state}: `_data_files` names no files")
    return files


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(COLUMNAR_SUFFIXES) and not COMPRESSIONS.get(path.suffix.lower()):
        return "columnar"
    return None


def iter_records(path: Path, json_columns=JSON_COLUMNS):
    """(where, parsed object or None, error) for every row of a prompt file or folder: the error is
    text, or the exception nobody foresaw. A file that cannot be read whole is a PromptFileError.

    `where` names the file and the line (JSONL, JSON arrays) or the row (Parquet, Arrow);
    `json_columns` are the Parquet and Arrow columns parsed where they hold JSON text."""
    if path.is_dir():
        for file in _prompt_files(path):
            yield from iter_records(file, json_columns)
        return
    kind = _kind(path)
    if kind == "json":
        yield from _iter_json_file(path)
    elif kind == "columnar":
        yield from _iter_columnar(path, json_columns)
    else:
        raise PromptFileError(
            f"{path}: unknown prompt file type; use .jsonl, .json (lines or one array), .parquet, .arrow, "
            "optionally compressed (.gz, .zst), or a folder of them (a `datasets` save_to_disk folder too)"
        )


def _sampled(position: int, options: ReadOptions) -> str | None:
    """Why a row is left out by max_rows or sample_fraction (a seeded, stable draw per row), or None."""
    if options.sample_fraction is not None:
        draw = int(stable_hash([options.seed, position])[:12], 16) / 16**12
        if draw >= options.sample_fraction:
            return f"not in the sample (sample_fraction {options.sample_fraction}, seed {options.seed})"
    return None


def _given_id(obj, options: ReadOptions, fallback: str) -> str:
    """The id a row that is not used goes by in its record: its own, if it has a usable one."""
    raw_id = obj.get(options.id_field) if isinstance(obj, dict) else None
    usable = isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool)
    return str(raw_id) if usable and str(raw_id).strip() and _valid_text(str(raw_id)) else fallback


def _fallback_id(source: str) -> str:
    """The id of a row known by its place only: "f-line-12" for "f.jsonl:12", "f-row-3" for "f.parquet:row 3"."""
    file, _, position = source.rpartition(":")
    place = position.replace("row ", "row-") if "row" in position else "line-" + position
    return f"{Path(file).name.split('.')[0]}-{place}"


def read_prompts(path: str | Path, options: ReadOptions | None = None) -> list[PromptRow]:
    """Every row of a prompt file as a list (`iter_prompts` streams them)."""
    return list(iter_prompts(path, options))


def iter_prompts(path: str | Path, options: ReadOptions | None = None) -> Iterator[PromptRow]:
    """Every row of a prompt file, in file order, read as it goes; unusable rows carry a reason
    naming file, line, field. Only ids and content hashes are remembered, for duplicates and dedup.

    Rows left out by `sample_fraction` or past `max_rows` are skipped rows too, with that reason.
    Whatever goes wrong with one row is that row's reason: a RowError as foreseen, any other
    exception as an `unexpected` row, its traceback logged. Only a PromptFileError (a file that
    cannot be read as a whole) or a missing path ends the reading."""
    options = options or ReadOptions()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    rows = _Rows(options)
    json_columns = tuple(dict.fromkeys([*JSON_COLUMNS, *([options.messages_field] if options.messages_field else [])]))
    n = 0
    for position_index, (source, obj, error) in enumerate(iter_records(path, json_columns)):
        n += 1
        try:
            row = rows.row(position_index, source, obj, error)
        except Exception as exc:  # the one guard: nothing about one row ends the file
            row = _unexpected_row(source, obj, exc, options)
        if row.reason is not None and not _valid_text(row.reason):  # a value quoted from the row
            row.reason = row.reason.encode("utf-8", "backslashreplace").decode("utf-8")
        yield row
    if not n:
        raise PromptFileError(f"prompts file {path} is empty: it holds no rows")


class _Rows:
    """One pass over a prompt file: each record to its PromptRow, with what the pass remembers
    (rows taken for max_rows, ids for duplicates, content hashes for dedup)."""

    def __init__(self, options: ReadOptions):
        self.options = options
        self.taken = 0
        self.first_seen: dict[str, str] = {}
        self.first_content: dict[str, str] = {}

    def row(self, position_index: int, source: str, obj, error) -> PromptRow:
        options = self.options
        fallback_id = _fallback_id(source)
        left_out = _sampled(position_index, options)
        if left_out is None and options.max_rows is not None and self.taken >= options.max_rows:
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
    if len(error) > 300:
        error = error[:300] + "..."
    return PromptRow(
        id=row_id,
        source=source,
        reason=f"{source}: unexpected error (a possible bug; the traceback is in the log): {error}",
        unexpected=True,
    )
