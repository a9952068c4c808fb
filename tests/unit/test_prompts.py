"""Input normalization: every bad row becomes a reason naming file, line and field; nothing else is lost."""

import json
from pathlib import Path

import pytest

from eagle3_datagen.storage.prompts import read_prompts

ROOT = Path(__file__).resolve().parents[2]


def write_lines(path, lines):
    with open(path, "wb") as fh:
        for line in lines:
            fh.write(
                line if isinstance(line, bytes) else (json.dumps(line) if not isinstance(line, str) else line).encode()
            )
            fh.write(b"\n")
    return path


def good(i, **extra):
    return {"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}"}], **extra}


@pytest.mark.parametrize(
    "bad, field",
    [
        ('{"id": "x", "messages": [', "malformed JSON"),
        (b'{"id": "x", "messages": [{"role": "user", "content": "caf\xe9"}]}', "not valid UTF-8"),
        ({"id": "x"}, "field 'messages': missing"),
        ({"id": "x", "messages": []}, "field 'messages': empty conversation"),
        ({"id": "x", "messages": "hi"}, "field 'messages': expected a list"),
        ({"id": "x", "messages": [{"role": "bot", "content": "hi"}]}, "field 'messages[0].role': unknown role 'bot'"),
        ({"id": "x", "messages": [{"role": "user", "content": 3}]}, "field 'messages[0].content'"),
        (
            {"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}},
            "field 'tools': expected a list",
        ),
        ({"id": "x", "messages": [{"role": "system", "content": "be nice"}]}, "nothing to answer"),
        ({"id": "x", "messages": [{"role": "tool", "content": "42"}]}, "field 'messages[0].tool_call_id'"),
        ({"id": ["x"], "messages": [{"role": "user", "content": "hi"}]}, "field 'id'"),
        (
            {"id": "x", "conversations": [{"from": "robot", "value": "hi"}]},
            "field 'conversations[0].from': unknown speaker",
        ),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_row_is_reported_with_file_line_and_field(tmp_path, bad, field):
    path = write_lines(tmp_path / "p.jsonl", [good(1), bad, good(3)])
    rows = read_prompts(path)
    assert [r.ok for r in rows] == [True, False, True]
    assert rows[1].reason.startswith(f"{path}:2: ")
    assert field in rows[1].reason
    assert [r.id for r in rows if r.ok] == ["r1", "r3"]


def test_an_empty_turn_is_where_the_conversation_ends_not_a_bad_row(tmp_path):
    """An empty user or assistant turn is kept and named (the turns before it are still made, see
    test_turns); an empty turn beside one of its own speaker's is merged away; a trailing empty answer
    is the one regenerated anyway."""
    convs = [
        [("human", "a"), ("gpt", "b"), ("human", "  "), ("gpt", "d"), ("human", "e")],
        [("human", "a"), ("human", ""), ("gpt", "b"), ("human", "c")],
        [("human", "a"), ("gpt", "")],
    ]
    rows = read_prompts(
        write_lines(
            tmp_path / "p.jsonl",
            [{"id": str(i), "conversations": [{"from": f, "value": v} for f, v in c]} for i, c in enumerate(convs)],
        )
    )
    assert all(r.ok for r in rows)
    assert rows[0].empty == (2, "conversations[2].value") and len(rows[0].messages) == 5
    assert rows[1].empty is None and [m["content"] for m in rows[1].messages] == ["a", "b", "c"]
    assert rows[1].fixes == {"same_speaker_merged": 1}
    assert rows[2].empty is None and rows[2].dropped_assistant


def test_duplicate_id_keeps_the_first_and_names_it(tmp_path):
    path = write_lines(tmp_path / "p.jsonl", [good(1), good(2), good(1)])
    rows = read_prompts(path)
    assert [r.ok for r in rows] == [True, True, False]
    assert f"duplicate id 'r1' (first seen at {path}:1)" in rows[2].reason


def test_trailing_assistant_message_is_dropped_for_regeneration(tmp_path):
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "old answer"},
    ]
    rows = read_prompts(write_lines(tmp_path / "p.jsonl", [{"id": "m", "messages": msgs}]))
    assert rows[0].ok and rows[0].dropped_assistant
    assert [m["content"] for m in rows[0].messages] == ["a", "b", "c"]


def test_sharegpt_is_normalized_to_openai_messages(tmp_path):
    row = {
        "id": "s",
        "conversations": [
            {"from": "system", "value": "sys"},
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "yo"},
            {"from": "human", "value": "again"},
        ],
    }
    rows = read_prompts(write_lines(tmp_path / "p.jsonl", [row]))
    assert rows[0].messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
    ]


def test_missing_id_gets_a_stable_content_hash(tmp_path):
    row = {"messages": [{"role": "user", "content": "no id here"}]}
    first = read_prompts(write_lines(tmp_path / "a.jsonl", [row]))[0].id
    second = read_prompts(write_lines(tmp_path / "b.jsonl", [good(1), row]))[1].id
    other = read_prompts(write_lines(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "other"}]}]))[
        0
    ].id
    assert first == second != other
    assert first.startswith("sha256-")


def test_text_parts_are_joined(tmp_path):
    row = {
        "id": "p",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    }
    assert read_prompts(write_lines(tmp_path / "p.jsonl", [row]))[0].messages[0]["content"] == "ab"


def test_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_prompts(tmp_path / "nope.jsonl")


def test_demo_prompt_files_are_clean():
    for name, minimum in (("math", 40), ("code", 40), ("chat", 40)):
        rows = read_prompts(ROOT / "config" / "prompts" / f"{name}.jsonl")
        assert len(rows) >= minimum
        assert all(r.ok for r in rows), [r.reason for r in rows if not r.ok]
    chat = read_prompts(ROOT / "config" / "prompts" / "chat.jsonl")
    assert sum(r.tools is not None for r in chat) >= 10
    assert any(r.messages[-1]["role"] == "tool" for r in chat)
    assert any(r.dropped_assistant for r in chat)
