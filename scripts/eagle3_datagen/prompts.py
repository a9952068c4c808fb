"""Read prompt files into normalized conversations; every bad row becomes a reason, never an exception.

Input rows are JSONL (or Parquet) with one conversation each, in OpenAI message form
(`{"id", "messages": [{"role", "content"}], "tools"?}`) or ShareGPT form (`"conversations"` with
`from`/`value`). A trailing assistant message is dropped: it is what gets regenerated (DESIGN §2).
"""

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .settings import stable_hash

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

    @property
    def ok(self) -> bool:
        return self.reason is None


class RowError(ValueError):
    """A problem with one field of one row; the message names the field."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"field '{field_name}': {problem}")


def _content_text(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RowError(f"{where}[{i}]", "only {'type': 'text', 'text': ...} parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise RowError(where, f"expected a string or a list of text parts, got {type(content).__name__}")


def _normalize_message(raw, index: int, sharegpt: bool) -> dict:
    where = f"{'conversations' if sharegpt else 'messages'}[{index}]"
    if not isinstance(raw, dict):
        raise RowError(where, f"expected an object, got {type(raw).__name__}")
    if sharegpt:
        speaker = raw.get("from")
        if speaker not in SHAREGPT_ROLES:
            raise RowError(
                f"{where}.from", f"unknown speaker {speaker!r} (expected one of {', '.join(SHAREGPT_ROLES)})"
            )
        message = {"role": SHAREGPT_ROLES[speaker], "content": raw.get("value")}
        content_field = f"{where}.value"
        for key in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            if key in raw:
                message[key] = raw[key]
    else:
        role = raw.get("role")
        if role not in ROLES:
            raise RowError(f"{where}.role", f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
        message = {
            k: v
            for k, v in raw.items()
            if k in ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
        }
        content_field = f"{where}.content"
    role = message["role"]
    text = _content_text(message.get("content"), content_field)
    message["content"] = text
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
        row_id = "sha256-" + stable_hash(obj)[:16]
    elif (
        isinstance(raw_id, (str, int))
        and not isinstance(raw_id, bool)
        and str(raw_id).strip()
        and "\n" not in str(raw_id)
    ):
        row_id = str(raw_id)
    else:
        raise RowError(options.id_field, f"expected a non-empty single-line string or integer, got {raw_id!r}")
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
    if options.system_prompt and messages and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": options.system_prompt})
        row.fixes["system_prompt_added"] = 1
    tools = obj.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RowError("tools", f"expected a list of tool objects, got {type(tools).__name__}")
        tools = tools or None
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
        row.dropped_assistant = True
    if not messages or messages[-1]["role"] not in ("user", "tool"):
        raise RowError(key, "nothing to answer: the conversation must end with a user or tool message")
    row.messages = messages
    row.tools = tools
    return row


class PromptFileError(ValueError):
    """A prompt file that cannot be read as a whole (truncated array, wrong format, bad compression)."""


COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
COLUMNAR_SUFFIXES = (".parquet", ".arrow")


# Prompt files are read a block at a time: a file of any size (a 600 MB ShareGPT array, say) never
# sits in memory whole, as bytes, text or objects.
BLOCK = 1 << 20


def _open_stream(path: Path):
    kind = COMPRESSIONS.get(path.suffix.lower())
    if kind == "gzip":
        import gzip

        return gzip.open(path, "rb")
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def _blocks(path: Path):
    """The file's bytes, decompressed by its suffix (.gz, .zst), a block at a time; an unreadable
    stream is the file's error."""
    kind = COMPRESSIONS.get(path.suffix.lower())
    try:
        with _open_stream(path) as fh:
            while block := fh.read(BLOCK):
                yield block
    except Exception as exc:  # gzip.BadGzipFile, zstandard.ZstdError, EOFError, ...
        raise PromptFileError(f"{path}: cannot be read as {kind} data: {type(exc).__name__}: {exc}") from None


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
    """(where, parsed object or None, error text) for each non-blank line of JSONL."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield where(number), None, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
            continue
        try:
            yield where(number), json.loads(text), None
        except json.JSONDecodeError as exc:
            yield where(number), None, f"malformed JSON: {exc.msg} at column {exc.colno}"


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
                    if end < len(text.buf) or text.eof:  # a number at the block's end may go on
                        break
                except json.JSONDecodeError as exc:
                    if text.eof:
                        raise PromptFileError(
                            f"{path}: the JSON array breaks off at {text.where(exc.pos)} ({exc.msg}) after {n} "
                            "complete elements; nothing of the file was used"
                        ) from None
                text.more()
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
    """JSONL, or one JSON array (what ShareGPT-style files are), whatever the suffix says."""
    blocks = _blocks(path)
    head = b""
    for block in blocks:
        head += block
        if head.lstrip():
            break
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


def _decode_json_columns(record: dict):
    """Conversation columns stored as JSON text, parsed; an error names the field."""
    for key, value in record.items():
        if isinstance(value, str) and key in ("messages", "conversations", "tools") and value[:1] in ("[", "{"):
            try:
                record[key] = json.loads(value)
            except json.JSONDecodeError as exc:
                return f"field '{key}': malformed JSON: {exc.msg}"
    return None


def _iter_columnar(path: Path):
    """Rows of a Parquet or Arrow file, a record batch at a time."""
    number = 0
    for batch in _record_batches(path):
        for record in batch.to_pylist():
            number += 1
            error = _decode_json_columns(record)
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
        files = [folder / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
        if files:
            return files
    files = sorted(p for p in folder.iterdir() if p.is_file() and _kind(p) is not None)
    if not files:
        raise PromptFileError(
            f"{folder}: a folder with no prompt files (JSONL, JSON, Parquet, Arrow, optionally .gz/.zst)"
        )
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


def iter_records(path: Path):
    """(where, parsed object or None, error text) for every row of a prompt file or folder.

    `where` names the file and the line (JSONL, JSON arrays) or the row (Parquet, Arrow)."""
    if path.is_dir():
        for file in _prompt_files(path):
            yield from iter_records(file)
        return
    kind = _kind(path)
    if kind == "json":
        yield from _iter_json_file(path)
    elif kind == "columnar":
        yield from _iter_columnar(path)
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
    return str(raw_id) if isinstance(raw_id, (str, int)) and str(raw_id).strip() else fallback


def read_prompts(path: str | Path, options: ReadOptions | None = None) -> list[PromptRow]:
    """Every row of a prompt file as a list (`iter_prompts` streams them)."""
    return list(iter_prompts(path, options))


def iter_prompts(path: str | Path, options: ReadOptions | None = None) -> Iterator[PromptRow]:
    """Every row of a prompt file, in file order, read as it goes; unusable rows carry a reason
    naming file, line, field. Only ids and content hashes are remembered, for duplicates and dedup.

    Rows left out by `sample_fraction` or past `max_rows` are skipped rows too, with that reason."""
    options = options or ReadOptions()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    n = 0
    first_seen: dict[str, str] = {}
    first_content: dict[str, str] = {}
    taken = 0
    for position_index, (source, obj, error) in enumerate(iter_records(path)):
        file, _, position = source.rpartition(":")  # "f.jsonl:12" or "f.parquet:row 12"
        fallback_id = f"{Path(file).name.split('.')[0]}-{position.replace('row ', 'row-') if 'row' in position else 'line-' + position}"
        left_out = _sampled(position_index, options)
        if left_out is None and options.max_rows is not None and taken >= options.max_rows:
            left_out = f"past max_rows {options.max_rows}"
        if left_out is not None:
            n += 1
            yield PromptRow(id=_given_id(obj, options, fallback_id), source=source, reason=f"{source}: {left_out}")
            continue
        taken += 1
        if error is not None:
            n += 1
            yield PromptRow(id=fallback_id, source=source, reason=f"{source}: {error}")
            continue
        try:
            row = normalize_row(obj, source=source, options=options)
        except RowError as exc:
            n += 1
            yield PromptRow(id=_given_id(obj, options, fallback_id), source=source, reason=f"{source}: {exc}")
            continue
        if row.id in first_seen:
            row.reason = f"{source}: field 'id': duplicate id {row.id!r} (first seen at {first_seen[row.id]})"
        else:
            first_seen[row.id] = source
            if options.dedup:
                content = stable_hash([row.messages, row.tools])
                if content in first_content:
                    row.reason = f"{source}: the same conversation as {first_content[content]!r} (dedup)"
                else:
                    first_content[content] = row.id
        n += 1
        yield row
    if not n:
        raise PromptFileError(f"prompts file {path} is empty: it holds no rows")
