"""Read prompt files into normalized conversations; every bad row becomes a reason, never an exception.

Input rows are JSONL (or Parquet) with one conversation each, in OpenAI message form
(`{"id", "messages": [{"role", "content"}], "tools"?}`) or ShareGPT form (`"conversations"` with
`from`/`value`). A trailing assistant message is dropped: it is what gets regenerated (DESIGN §2).
"""

import json
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
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


@dataclass
class PromptRow:
    """One input conversation, normalized; `reason` is set when the row cannot be used."""

    id: str
    source: str
    messages: list = field(default_factory=list)
    tools: list | None = None
    dropped_assistant: bool = False
    reason: str | None = None

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


def normalize_row(obj, *, source: str) -> PromptRow:
    """Normalize one parsed input object. Raises RowError for an unusable row (id still derived)."""
    if not isinstance(obj, dict):
        raise RowError("<row>", f"expected a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id")
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
        raise RowError("id", f"expected a non-empty single-line string or integer, got {raw_id!r}")
    row = PromptRow(id=row_id, source=source)
    sharegpt = "messages" not in obj and "conversations" in obj
    key = "conversations" if sharegpt else "messages"
    raw_messages = obj.get(key)
    if raw_messages is None:
        raise RowError("messages", "missing (expected 'messages' or ShareGPT 'conversations')")
    if not isinstance(raw_messages, list):
        raise RowError(key, f"expected a list, got {type(raw_messages).__name__}")
    if not raw_messages:
        raise RowError(key, "empty conversation")
    messages = [_normalize_message(m, i, sharegpt) for i, m in enumerate(raw_messages)]
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


def _iter_jsonl(path: Path):
    """Yield (line number, parsed object or error text) for each non-blank line of a JSONL file."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, None, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                continue
            try:
                yield number, json.loads(text), None
            except json.JSONDecodeError as exc:
                yield number, None, f"malformed JSON: {exc.msg} at column {exc.colno}"


def _iter_parquet(path: Path):
    import pyarrow.parquet as pq

    for number, record in enumerate(pq.read_table(path).to_pylist(), start=1):
        for key in ("messages", "conversations", "tools"):
            if isinstance(record.get(key), str):  # JSON stored as text
                try:
                    record[key] = json.loads(record[key])
                except json.JSONDecodeError as exc:
                    yield number, None, f"field '{key}': malformed JSON: {exc.msg}"
                    break
        else:
            yield number, record, None


def read_prompts(path: str | Path) -> list[PromptRow]:
    """Every row of a prompt file, in file order; unusable rows carry a reason naming file, line, field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    rows_iter = _iter_parquet(path) if path.suffix == ".parquet" else _iter_jsonl(path)
    rows: list[PromptRow] = []
    first_seen: dict[str, str] = {}
    for number, obj, error in rows_iter:
        source = f"{path}:{number}"
        if error is not None:
            rows.append(PromptRow(id=f"{path.stem}-line-{number}", source=source, reason=f"{source}: {error}"))
            continue
        try:
            row = normalize_row(obj, source=source)
        except RowError as exc:
            raw_id = obj.get("id") if isinstance(obj, dict) else None
            row_id = (
                str(raw_id) if isinstance(raw_id, (str, int)) and str(raw_id).strip() else f"{path.stem}-line-{number}"
            )
            rows.append(PromptRow(id=row_id, source=source, reason=f"{source}: {exc}"))
            continue
        if row.id in first_seen:
            row.reason = f"{source}: field 'id': duplicate id {row.id!r} (first seen at {first_seen[row.id]})"
        else:
            first_seen[row.id] = source
        rows.append(row)
    if not rows:
        raise ValueError(f"prompts file {path} is empty: it holds no rows")
    return rows
