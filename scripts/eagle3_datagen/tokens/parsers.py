"""SGLang's reasoning and tool-call parsers, re-implemented in plain Python, per SGLang version.

`check_parsers` replays SGLang's OpenAI chat layer (`serving_chat.py`: the text to `reasoning_content`,
`content`, `tool_calls`) offline, so these follow SGLang's source (non-streaming paths) version by
version: `srt/parser/reasoning_parser.py`, `srt/function_call/kimik2_detector.py`, `qwen25_detector.py`
and `function_call_parser.FunctionCallParser.parse_non_stream`. Where they differ by version:
- reasoning: up to 0.5.12 every `<think>` is removed and the texts are stripped; from 0.5.13 only
  leading `<think>` tags go. `kimi_k2` is `DeepSeekR1Detector` (always forced) up to 0.5.8 and
  `KimiK2Detector` (`<|tool_calls_section_begin|>` ends the reasoning) from 0.5.10; 0.5.9 maps it to
  `Qwen3Detector` and is not modelled. `qwen3` learns `tool_start_token="<tool_call>"` in 0.5.14.
- `kimi_k2` tool calls: the normal text is the text before the section; the call regex, its id
  pattern and name inference change in 0.5.9, 0.5.10 and 0.5.12 (`_kimi_regexes`); `tool_index` is the
  model's `:N` up to 0.5.14 and the call's position from 0.5.15.
- `qwen25`: normal text is the stripped text before the first block, arguments re-serialized, calls to
  undeclared tools skipped; `tool_index` is the tool's position in the request's tools.
- No call found: the full text up to 0.5.15, the detector's normal text from 0.5.16.
Versions outside the modelled ranges are refused rather than guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

Version = tuple[int, int, int]

THINK_START = "<think>"
THINK_END = "</think>"
KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
QWEN_TOOL_START = "<tool_call>"

REASONING_PARSERS = ("kimi_k2", "qwen3", "qwen3-thinking", "deepseek-r1")
TOOL_CALL_PARSERS = ("kimi_k2", "qwen25")

# Inclusive version ranges whose source was read; anything else is refused.
_KNOWN_RANGES: tuple[tuple[Version, Version], ...] = (((0, 5, 6), (0, 5, 8)), ((0, 5, 10), (0, 5, 23)))


class UnsupportedVersion(ValueError):
    pass


def parse_version(version: str | tuple) -> Version:
    """`"0.5.23"`, `"0.5.8.post1"` or a tuple → `(0, 5, 23)`; outside the known ranges → error."""
    if isinstance(version, tuple):
        parts = tuple(int(p) for p in version[:3])
    else:
        m = re.match(r"^\s*v?(\d+)\.(\d+)\.(\d+)", str(version))
        if not m:
            raise UnsupportedVersion(f"cannot read SGLang version {version!r} (expected e.g. '0.5.23')")
        parts = tuple(int(g) for g in m.groups())
    if len(parts) != 3:
        raise UnsupportedVersion(f"cannot read SGLang version {version!r} (expected three numbers)")
    v: Version = parts  # type: ignore[assignment]
    if not any(lo <= v <= hi for lo, hi in _KNOWN_RANGES):
        known = ", ".join(f"{'.'.join(map(str, lo))}–{'.'.join(map(str, hi))}" for lo, hi in _KNOWN_RANGES)
        raise UnsupportedVersion(
            f"SGLang {'.'.join(map(str, v))}: parser semantics are only modelled for versions {known}; "
            "read that version's srt/parser/reasoning_parser.py and srt/function_call/ before adding it"
        )
    return v


def _reasoning_spec(parser: str, v: Version) -> tuple[bool, str | None]:
    """(whether the detector ignores force_reasoning and is always in reasoning, its tool-start token)."""
    if parser == "deepseek-r1" or (parser == "kimi_k2" and v <= (0, 5, 8)):  # 0.5.8's Kimi: DeepSeekR1Detector
        return True, None
    if parser == "kimi_k2":
        return False, KIMI_SECTION_BEGIN  # KimiK2Detector
    if parser in ("qwen3", "qwen3-thinking"):
        return False, QWEN_TOOL_START if v >= (0, 5, 14) else None
    raise _unknown("reasoning", parser)


def _unknown(kind: str, parser: str) -> ValueError:
    known = REASONING_PARSERS if kind == "reasoning" else TOOL_CALL_PARSERS
    return ValueError(f"unknown {kind} parser {parser!r}; known: {', '.join(known)}")


def parse_reasoning(text: str, *, parser: str, version, force_reasoning: bool | None = None) -> tuple[str, str]:
    """`ReasoningParser(parser, stream_reasoning=False, force_reasoning=...).parse_non_stream(text)` as
    `(reasoning_text, normal_text)` ("" where SGLang has None); `force_reasoning=None`: the parser's own."""
    v = parse_version(version)
    always_forced, tool_start = _reasoning_spec(parser, v)
    if not (always_forced or force_reasoning or parser == "qwen3-thinking" or THINK_START in text):
        return "", text
    if v <= (0, 5, 12):
        processed = text.replace(THINK_START, "").strip()
        if THINK_END not in processed:
            if tool_start is not None and tool_start in processed:
                idx = processed.find(tool_start)
                return processed[:idx].strip(), processed[idx:]
            return processed, ""
        reasoning, normal = processed.split(THINK_END, 1)
        return reasoning, normal.strip()
    processed = text
    while processed.startswith(THINK_START):
        processed = processed[len(THINK_START) :]
    if THINK_END not in processed:
        idx = processed.find(tool_start) if tool_start else -1
        if idx != -1:
            return processed[:idx], processed[idx:]
        return processed, ""  # truncated before the end token: all reasoning
    reasoning, normal = processed.split(THINK_END, 1)
    return reasoning, normal


def chat_force_reasoning(
    parser: str, version, chat_template_kwargs: dict | None, chat_template: str | None = None
) -> bool:
    """The `force_reasoning` that `serving_chat` passes to the reasoning parser for a request:
    `template_manager.force_reasoning` (a template whose generation prompt opens `<think>`, from 0.5.13
    only without a thinking toggle) or `_get_reasoning_from_request(request)` (the kwargs' toggle)."""
    v = parse_version(version)
    kwargs = chat_template_kwargs or {}
    if chat_template and re.search(r"<\|im_start\|>assistant\\n<think>\\n", chat_template):
        if v <= (0, 5, 8) or ("enable_thinking" not in chat_template and "thinking" not in chat_template):
            return True
    if parser == "kimi_k2":
        return True if v <= (0, 5, 8) else kwargs.get("thinking") is not False
    if parser in ("qwen3", "qwen3-thinking"):
        if v <= (0, 5, 8):
            return not kwargs or kwargs.get("enable_thinking", True) is True
        return kwargs.get("enable_thinking") is not False
    if parser == "deepseek-r1":
        return True
    raise _unknown("reasoning", parser)


@dataclass(frozen=True)
class ToolCall:
    tool_index: int
    name: str
    arguments: str  # the JSON text as the parser returns it


class ToolParseError(Exception):
    """The detector raised (e.g. a qwen25 block that is JSON but not an object); the chat layer
    catches it and keeps the text unchanged with no calls."""


def _tool_names(tools) -> list[str]:
    return [(t.get("function", t) if isinstance(t, dict) else {}).get("name") for t in tools or []]


def _tool_properties(tool: dict, descend: bool) -> set:
    params = tool.get("function", tool).get("parameters") or {}
    if not descend:
        return set((params.get("properties") or {}).keys()) if isinstance(params, dict) else set()
    return _schema_properties(params)


def _schema_properties(schema) -> set:
    """The property names of a JSON schema, or of its anyOf/oneOf/allOf branches."""
    if not isinstance(schema, dict):
        return set()
    if isinstance(schema.get("properties"), dict):
        return set(schema["properties"])
    branches = [b for key in ("anyOf", "oneOf", "allOf") if isinstance(schema.get(key), list) for b in schema[key]]
    return set().union(*map(_schema_properties, branches))


def _kimi_regexes(v: Version):
    if v <= (0, 5, 9):
        call_id, name = r"[\w\.]+:\d+", r"[\w\.]+"
    elif v <= (0, 5, 11):
        call_id, name = r"[\w.\-]+:\d+", r"[\w.\-]+"
    else:
        call_id, name = r"[^\s<|]+", r"[\w.\-]+"
    flags = re.DOTALL if v >= (0, 5, 9) else 0
    call = re.compile(
        r"<\|tool_call_begin\|>\s*(?P<tool_call_id>" + call_id + r")\s*<\|tool_call_argument_begin\|>\s*"
        r"(?P<function_arguments>\{.*?\})\s*<\|tool_call_end\|>",
        flags,
    )
    return call, re.compile(r"^(?:functions\.)?(?P<name>" + name + r"):(?P<index>\d+)$")


def _kimi_infer_name(tools, args: str, v: Version) -> str | None:
    tools = list(tools or [])
    if not tools:
        return None
    if len(tools) == 1:
        return _tool_names(tools)[0]
    if not args:
        return None
    try:
        arg_keys = set(json.loads(args).keys())
    except (json.JSONDecodeError, TypeError):
        return None
    best_name, best_score = None, -1
    for tool, name in zip(tools, _tool_names(tools)):
        props = _tool_properties(tool, descend=v >= (0, 5, 20))
        if not props:
            continue
        score = len(arg_keys & props) - len(arg_keys - props)
        if score > best_score:
            best_score, best_name = score, name
    return best_name


def _kimi_detect(text: str, tools, v: Version) -> tuple[str, list[ToolCall]]:
    if KIMI_SECTION_BEGIN not in text:
        return text, []
    call_re, id_re = _kimi_regexes(v)
    try:
        calls: list[ToolCall] = []
        for call_id, args in call_re.findall(text):
            m = id_re.match(call_id)
            if m:
                name, index = m.group("name"), int(m.group("index"))
            elif v >= (0, 5, 12) and call_id.isdecimal():  # SGLang's ^\d+$
                name, index = _kimi_infer_name(tools, args, v), int(call_id)
            else:
                continue
            if name is None:
                continue
            calls.append(ToolCall(len(calls) if v >= (0, 5, 15) else index, name, args))
        return text[: text.find(KIMI_SECTION_BEGIN)], calls
    except Exception:  # SGLang logs and returns the whole text as normal
        return text, []


_QWEN_BOT, _QWEN_EOT = "<tool_call>\n", "\n</tool_call>"
_QWEN_BLOCK = re.compile(re.escape(_QWEN_BOT) + "(.*?)" + re.escape(_QWEN_EOT), re.DOTALL)


def _qwen25_detect(text: str, tools) -> tuple[str, list[ToolCall]]:
    idx = text.find(_QWEN_BOT)
    if idx == -1:
        return text, []
    normal = text[:idx].strip()
    indices = {name: i for i, name in enumerate(_tool_names(tools)) if name}
    calls: list[ToolCall] = []
    for block in _QWEN_BLOCK.findall(text):
        try:
            parsed = json.loads(block.strip())
        except json.JSONDecodeError:
            continue
        for act in parsed if isinstance(parsed, list) else [parsed]:
            if not hasattr(act, "get"):
                raise ToolParseError(f"tool call is not a JSON object: {act!r}")
            name = act.get("name")
            if not (name and name in indices):
                continue  # undeclared tool: skipped (SGLANG_FORWARD_UNKNOWN_TOOLS unset)
            args = json.dumps(act.get("parameters") or act.get("arguments", {}), ensure_ascii=False)
            calls.append(ToolCall(indices.get(name, -1), name, args))
    return normal, calls


def detect_and_parse(text: str, tools, *, parser: str, version) -> tuple[str, list[ToolCall]]:
    """The detector's `detect_and_parse(text, tools)`: `(normal_text, calls)`; `ToolParseError` where it raises."""
    v = parse_version(version)
    if parser == "kimi_k2":
        return _kimi_detect(text, tools, v)
    if parser == "qwen25":
        return _qwen25_detect(text, tools)
    raise _unknown("tool-call", parser)


def has_tool_call(text: str, *, parser: str) -> bool:
    if parser == "kimi_k2":
        return KIMI_SECTION_BEGIN in text
    if parser == "qwen25":
        return _QWEN_BOT in text
    raise _unknown("tool-call", parser)


def parse_tool_calls(text: str, tools, *, parser: str, version) -> tuple[str, list[ToolCall]]:
    """What `serving_chat._process_tool_calls` (tool_choice "auto") makes of the text: `(content, calls)`;
    no tools, no section marker or a detector error: the text unchanged."""
    v = parse_version(version)
    if not tools or not has_tool_call(text, parser=parser):
        return text, []
    try:
        normal, calls = detect_and_parse(text, tools, parser=parser, version=v)
    except ToolParseError:
        return text, []
    if calls:
        return normal, calls
    return (normal if v >= (0, 5, 16) else text), []


def tool_call_id(call: ToolCall, *, parser: str, history_count: int, position: int) -> str:
    """`serving_chat._process_tool_call_id`: Kimi-K2 ids are `functions.{name}:{history + tool_index}`;
    other parsers get a random `call_...` id in SGLang (a stable stand-in is used here)."""
    if parser == "kimi_k2":
        return f"functions.{call.name}:{history_count + call.tool_index}"
    return f"call_{position}"
