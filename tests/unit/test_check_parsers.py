"""check_parsers on hand-built output ids: every verdict class, and exact rows for Kimi and Qwen3."""

import json
import shutil

import pytest
from transformers import AutoTokenizer

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.steps import check_parsers as parser_check
from eagle3_datagen.tokens.templating import ChatTokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def kimi_profile(path, version="0.5.23"):
    return ModelProfile(
        name="kimi",
        tokenizer=str(path),
        context_length=8192,
        prompt_suffix=("<think>",),
        reasoning_end="</think>",
        stop_tokens=("<|im_end|>",),
        reasoning_parser="kimi_k2",
        tool_call_parser="kimi_k2",
        sglang_version=version,
    )


class Rows:
    """Builds generation and prompt rows from text pieces and control tokens."""

    def __init__(self, tokenizer, profile):
        self.tok, self.profile = tokenizer, profile
        self.gens = []

    def id(self, token):
        return self.tok.convert_tokens_to_ids(token)

    def ids(self, *pieces):
        out = []
        for p in pieces:
            if isinstance(p, list):
                out.extend(p)
            elif p.startswith("<") and p.endswith(">") and self.tok.convert_tokens_to_ids(p) != self.tok.unk_token_id:
                out.append(self.id(p))
            else:
                out.extend(self.tok.backend_tokenizer.encode(p, add_special_tokens=False).ids)
        return out

    def add(self, name, *pieces, finish="stop", tools=None, messages=USER):
        prompt_ids = ChatTokenizer(self.tok, self.profile).tokenize([messages], [tools])[0].prompt_ids
        out = self.ids(*pieces)
        self.gens.append(
            {
                "id": name,
                "sample_index": 0,
                "turn": 0,
                "status": "ok",
                "messages": json.dumps(messages),
                "tools": json.dumps(tools) if tools else "",
                "prompt_ids": prompt_ids,
                "output_ids": out,
                "finish_type": finish,
                "finish_matched": str(out[-1]) if finish == "stop" else "",
            }
        )

    def check(self):
        rows = parser_check.check_rows(self.gens, tokenizer=self.tok, profile=self.profile)
        return {r["id"]: r for r in rows}


def kimi_call(args='{"city": "Paris"}', call_id="functions.get_weather:0"):
    return [
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        call_id,
        "<|tool_call_argument_begin|>",
        args,
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
    ]


@pytest.fixture(scope="module")
def kimi(kimi_tokenizer_dir, kimi_tokenizer):
    return kimi_tokenizer, kimi_tokenizer_dir


def test_kimi_0523_every_class(kimi):
    tok, path = kimi
    r = Rows(tok, kimi_profile(path))
    r.add("empty_reasoning_answer", "</think>", "It is sunny.", "<|im_end|>")
    r.add("tool_call", "Need the weather.", "</think>", "Checking.", *kimi_call(), "<|im_end|>", tools=TOOLS)
    r.add("reasoning_answer", "Let me think about it.", "</think>", "It is sunny.", "<|im_end|>")
    r.add("lost_end", "R", "</think>", "A", *kimi_call(), "</think>", "tail", "<|im_end|>", tools=TOOLS)
    r.add("truncated", "Thinking forever and", finish="length")
    r.add("reshaped", "Need.", "</think>", *kimi_call(call_id=" functions.get_weather:0"), "<|im_end|>", tools=TOOLS)
    r.add(
        "multi_call_index",
        "Need.",
        "</think>",
        *kimi_call(call_id="functions.get_weather:5"),
        "<|im_end|>",
        tools=TOOLS,
    )
    r.add("after_section", "Need.", "</think>", *kimi_call(), "More text.", "<|im_end|>", tools=TOOLS)
    r.add("drift", "</think>", "It is sun", "ny.", "<|im_end|>")
    r.add("other", "<think>", "R", "</think>", "Checking.", *kimi_call(), "<|im_end|>", tools=TOOLS)
    r.add("answer_truncated", "R", "</think>", *kimi_call(), "Then", finish="length", tools=TOOLS)
    v = r.check()
    got = {k: row["verdict"] for k, row in v.items()}
    assert got == {
        "empty_reasoning_answer": "exact",
        "tool_call": "exact",
        "reasoning_answer": "reasoning_dropped_by_template",
        "lost_end": "reasoning_token_lost",
        "truncated": "truncated_without_reasoning_end",
        "reshaped": "tool_call_reshaped",
        "multi_call_index": "tool_call_reshaped",
        "after_section": "text_after_tool_section_dropped",
        "drift": "retokenization_drift",
        "other": "other",
        "answer_truncated": "text_after_tool_section_dropped",
    }
    tool = v["tool_call"]
    assert (
        tool["first_diff"] is None
        and tool["has_tools"]
        and tool["n_reasoning_tokens"] == len(r.ids("Need the weather."))
    )
    assert tool["n_answer_tokens"] == len(r.gens[1]["output_ids"]) - tool["n_reasoning_tokens"] - 1
    dropped = v["reasoning_answer"]
    assert "Let me think about it." in dropped["excerpt_expected"] and "<think></think>" in dropped["excerpt_route"]
    reshaped = v["reshaped"]
    assert (
        reshaped["first_diff"] > len(r.gens[5]["prompt_ids"])
        and "<|tool_call_begin|> functions" in reshaped["excerpt_expected"]
    )
    assert (
        v["truncated"]["n_reasoning_tokens"] == len(r.gens[4]["output_ids"]) and v["truncated"]["n_answer_tokens"] == 0
    )
    counts = parser_check.counts(list(v.values()))
    assert counts["total"] == 11 and counts["exact"] == 2 and set(counts) == set(parser_check.VERDICTS) | {"total"}


def test_kimi_history_tool_ids(kimi):
    tok, path = kimi
    history = USER + [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "r",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "name": "get_weather", "content": "sunny"},
    ]
    r = Rows(tok, kimi_profile(path))
    r.add(
        "second_call",
        "More.",
        "</think>",
        *kimi_call(call_id="functions.get_weather:1"),
        "<|im_end|>",
        tools=TOOLS,
        messages=history,
    )
    r.add(
        "restarted_counter",
        "More.",
        "</think>",
        *kimi_call(call_id="functions.get_weather:0"),
        "<|im_end|>",
        tools=TOOLS,
        messages=history,
    )
    v = r.check()
    assert v["second_call"]["verdict"] == "exact"
    assert v["restarted_counter"]["verdict"] == "tool_call_reshaped"


def test_kimi_058_whitespace_and_multiline(kimi):
    tok, path = kimi
    r = Rows(tok, kimi_profile(path, "0.5.8"))
    r.add("stripped", "R", "</think>", "\n\nChecking.", *kimi_call(), "<|im_end|>", tools=TOOLS)
    r.add(
        "multiline_kept_as_text", "R", "</think>", *kimi_call(args='{\n "city": "Paris"\n}'), "<|im_end|>", tools=TOOLS
    )
    r.add("tool_call", "R", "</think>", "Checking.", *kimi_call(), "<|im_end|>", tools=TOOLS)
    got = {k: row["verdict"] for k, row in r.check().items()}
    # 0.5.8 finds no call in multi-line arguments and keeps the section as content; the turn then has
    # no tool_calls, so the Kimi template renders it as a finished answer, with its reasoning dropped.
    assert got == {
        "stripped": "whitespace_changed",
        "multiline_kept_as_text": "reasoning_dropped_by_template",
        "tool_call": "exact",
    }
    r23 = Rows(tok, kimi_profile(path))
    r23.add("multiline", "R", "</think>", *kimi_call(args='{\n "city": "Paris"\n}'), "<|im_end|>", tools=TOOLS)
    assert r23.check()["multiline"]["verdict"] == "exact"


def test_special_reasoning_end_is_decoded_away(kimi, tmp_path):
    """A tokenizer whose `</think>` is special loses it in the chat layer's decode when there are no tools."""
    _, path = kimi
    special = tmp_path / "kimi_special_think"
    shutil.copytree(path, special)
    for name, key in (("tokenizer.json", None), ("tokenizer_config.json", "added_tokens_decoder")):
        data = json.loads((special / name).read_text())
        entries = data["added_tokens"] if key is None else data[key].values()
        for entry in entries:
            if entry["content"] == "</think>":
                entry["special"] = True
        (special / name).write_text(json.dumps(data))
    tok = AutoTokenizer.from_pretrained(str(special))
    r = Rows(tok, kimi_profile(special))
    r.add("decoded_away", "</think>", "It is sunny.", "<|im_end|>")
    r.add("tools_keep_it", "R", "</think>", "Checking.", *kimi_call(), "<|im_end|>", tools=TOOLS)
    got = {k: row["verdict"] for k, row in r.check().items()}
    assert got == {"decoded_away": "reasoning_token_lost", "tools_keep_it": "exact"}


def test_qwen3(qwen3_tokenizer_dir, qwen3_tokenizer):
    tok = qwen3_tokenizer
    profile = ModelProfile(
        name="qwen3",
        tokenizer=str(qwen3_tokenizer_dir),
        context_length=8192,
        reasoning_end="</think>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
        sglang_version="0.5.23",
    )
    qwen_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    r = Rows(tok, profile)
    r.add("answer", "<think>", "\nLet me think.\n", "</think>", "\n\nIt is sunny.", "<|im_end|>")
    r.add("tool", "<think>", "\nNeed weather.\n", "</think>", "\n\n", qwen_call, "<|im_end|>", tools=TOOLS)
    r.add("spaced", "<think>", "\nR\n", "</think>", "\n\nIt is sunny.", "<|im_end|>")
    r.add("no_blank_line", "<think>", "\nR\n", "</think>", "It is sunny.", "<|im_end|>")
    r.add("truncated", "<think>", "\nStill thinking", finish="length")
    got = {k: row["verdict"] for k, row in r.check().items()}
    assert got == {
        "answer": "exact",
        "tool": "exact",
        "spaced": "exact",
        "no_blank_line": "whitespace_changed",
        "truncated": "truncated_without_reasoning_end",
    }
