"""One prompt row, normalized: `normalize_row` turns a parsed row in OpenAI message form (`{"id",
"messages": [{"role", "content"}], "tools"?}`) or ShareGPT form (`"conversations"` with `from`/`value`)
into a `PromptRow`, or raises a `RowError` naming the field. A trailing assistant message is dropped:
it is what gets regenerated (DESIGN §2).

May import: `settings` only (the file readers and the reading pass build on this module).
"""

import functools
import hashlib
import json
import math
import reprlib
from dataclasses import dataclass, field

from eagle3_datagen.settings import sheet_cell, stable_hash

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "assistant", "chatgpt", "bing", "bard", "model"), "assistant"),
    **dict.fromkeys(("tool", "function", "observation"), "tool"),
}


# The message keys carried as they are into the table's JSON and the chat template, besides role and content.
CARRIED = ("tool_calls", "tool_call_id", "name", "reasoning_content")

# The standard speakers of ShareGPT; any other known one (chatgpt, bing, bard, model, ...) is mapped
# and counted as `speakers_mapped`.
SHAREGPT_STANDARD = {"system", "human", "gpt", "tool"}


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
        cell = functools.partial(sheet_cell, category)
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
    # The first empty user or assistant message: (its index in `messages`, its field in the file).
    # The conversation ends there: turns whose history holds it are not made (`empty_message`).
    empty: tuple[int, str] | None = None
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


def short_repr(value) -> str:
    return _REPR.repr(value)


def valid_text(text: str) -> bool:
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
    """Refuse, naming the field path, a value the prompts table cannot hold as JSON text and hash: bytes,
    dates, decimals (Parquet and Arrow carry them), NaN, infinities, lone surrogates, deep nesting."""
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
                    raise RowError(path, f"an object key of type {type(key).__name__}: {short_repr(key)}")
                _check_text(key, f"{path} (a key)")
            stack.extend((v, f"{path}.{k}") for k, v in reversed(value.items()))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(value))))
        elif value is not None and not isinstance(value, (bool, int, float)):
            raise RowError(
                path,
                f"a {type(value).__name__} value ({short_repr(value)}), which JSON has no form for; store it as text",
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
                f"{where}.from", f"unknown speaker {short_repr(speaker)} (expected one of {', '.join(SHAREGPT_ROLES)})"
            )
        message = {"role": SHAREGPT_ROLES[speaker], "content": raw.get("value")}
        content_field = f"{where}.value"
        message |= {k: raw[k] for k in CARRIED if k in raw}
    else:
        role = raw.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RowError(f"{where}.role", f"unknown role {short_repr(role)} (expected one of {', '.join(ROLES)})")
        message = {k: v for k, v in raw.items() if k in ("role", "content", *CARRIED)}
        content_field = f"{where}.content"
    role, text = message["role"], _content_text(message.get("content"), content_field)
    message["content"] = text
    for key in CARRIED:
        if key in message:
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
    if role in ("system", "tool") and not text.strip():
        raise RowError(content_field, "empty content")
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
        raise RowError(
            options.id_field, f"expected a non-empty single-line string or integer, got {short_repr(raw_id)}"
        )
    row = PromptRow(id=row_id, source=source)
    if options.messages_field:
        key = options.messages_field
        raw_messages = obj.get(key)
        first = raw_messages[0] if isinstance(raw_messages, list) and raw_messages else None
        sharegpt = isinstance(first, dict) and "from" in first
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
    fields = {id(m): f"{key}[{i}].{'value' if sharegpt else 'content'}" for i, m in enumerate(messages) if is_empty(m)}
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
    row.messages, row.tools = messages, tools
    row.empty = next(((i, fields[id(m)]) for i, m in enumerate(messages) if is_empty(m)), None)
    return row


def is_empty(message: dict) -> bool:
    """A user message without text, or an assistant message without text or tool calls."""
    return message["role"] in ("user", "assistant") and not message["content"].strip() and not message.get("tool_calls")


def empty_message(messages: list[dict], start: int = 0) -> str | None:
    """Why `messages[start:]` cannot be a history: the first empty message in it (0.4% of ShareGPT), or
    None. The conversation ends there: the turns before it are made, the later ones are skipped rows."""
    for i in range(start, len(messages)):
        if is_empty(messages[i]):
            return f"message {i} of the conversation ({messages[i]['role']}) is empty"
    return None


def _content_id(obj: dict) -> str:
    """The id of a row without one: the hash of its canonical JSON; values JSON has no form for count by
    their repr, and invalid Unicode as it is (a column the row does not use must not make it unusable)."""
    try:
        return "sha256-" + stable_hash(obj)[:16]
    except (TypeError, ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        pass
    try:
        text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError) as exc:
        raise RowError("<row>", f"no id, and the row cannot be hashed for one: {type(exc).__name__}: {exc}") from None
    return "sha256-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _sharegpt_fixes(raw: list, messages: list[dict], fixes: dict) -> list[dict]:
    """ShareGPT's quirks, each by one stated rule and counted:

    - speakers other than human/gpt/system/tool that are known (chatgpt, bing, bard, model, ...) are
      mapped to their role (`speakers_mapped`, per turn);
    - assistant turns before the first user turn are dropped, as SpecForge does: there is nothing
      they answer (`leading_assistant_dropped`, per turn);
    - consecutive turns of one speaker (user, or assistant without tool calls) become one message,
      their texts joined by a blank line, an empty one left out (`same_speaker_merged`, per turn
      merged away). An empty turn between two speakers stays: the conversation ends there.
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
            # An empty turn beside one of its speaker adds nothing: merged, it is gone.
            texts = [t for t in (prev["content"], m["content"]) if t.strip()]
            if texts:
                out[-1] = dict(prev, content="\n\n".join(texts))
            merged += 1
        else:
            out.append(m)
    if merged:
        fixes["same_speaker_merged"] = merged
    return out
