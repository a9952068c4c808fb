"""Kimi-K2.5's real tokenizer format: TikToken remote code (tiktoken.model, no tokenizer.json, no
backend_tokenizer), loaded through the project's own code, as exact as the fast path."""

import json

import pytest

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens.encoding import ControlText
from eagle3_datagen.tokens.templating import ChatTokenizer
from eagle3_datagen.tokens.vocabulary import load_tokenizer, tiktoken_model

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "functions.get_weather:0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
# (messages, tools, literal strings typed into user/system/tool text)
CONVERSATIONS = [
    ([{"role": "user", "content": "What is 2+2?"}], None, []),
    ([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Bonjour"}], None, []),
    (
        [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7.", "reasoning_content": "Small primes: 2, 3, 5, 7."},
            {"role": "user", "content": "Another one?"},
        ],
        None,
        [],
    ),
    ([{"role": "user", "content": "Weather in Oslo?"}], WEATHER, []),
    (
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather", "content": '{"temp": 3}'},
        ],
        WEATHER,
        [],
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": "Part one, "}, {"type": "text", "text": "part two."}]}],
        None,
        [],
    ),
    ([{"role": "user", "content": "What does <|im_end|> mean in a chat template?"}], None, ["<|im_end|>"]),
    ([{"role": "user", "content": "Explain the <think> tag and </think> too."}], None, ["<think>", "</think>"]),
    ([{"role": "user", "content": "Is <|reserved_token_163600|> a token?"}], None, ["<|reserved_token_163600|>"]),
    (
        [{"role": "system", "content": "Never print <|im_user|>."}, {"role": "user", "content": "ok"}],
        None,
        ["<|im_user|>"],
    ),
    (
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "content": "error: <|tool_call_end|> unexpected"},
        ],
        WEATHER,
        ["<|tool_call_end|>"],
    ),
    ([{"role": "user", "name": "alice", "content": "Hi, I am Alice. " + "Long text. " * 300}], None, []),
    # Over TiktokenPath.CHUNKING_FREE_CHARS: the split path, with a literal in it too.
    ([{"role": "user", "content": "A long one. " * 2500 + "Then <|im_end|>."}], None, ["<|im_end|>"]),
    ([{"role": "user", "content": "中文也可以吗？ emoji 🙂 and tabs\t\tand\n\nnewlines"}], None, []),
]


@pytest.fixture(scope="module")
def kimi(kimi_tiktoken_dir):
    profile = ModelProfile(
        name="kimi",
        tokenizer=str(kimi_tiktoken_dir),
        context_length=131072,
        trust_remote_code=True,
        stop_tokens=("<|im_end|>",),
        chat_template_kwargs={"thinking": True},
        prompt_suffix=("<think>",),
    )
    return load_tokenizer(profile), profile


def reference_ids(tok, messages, tools, literals, **kwargs):
    """The tokenizer's own apply_chat_template, except that each literal control string typed into the
    text is encoded alone as plain text (`encode(span, allow_special_tokens=False)`)."""
    if not literals:
        return tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs)
    typed = [
        m["content"] for m in messages if m["role"] != "assistant" and any(lit in m["content"] for lit in literals)
    ]
    ids, pos = [], 0
    for content in typed:
        start = text.index(content, pos)
        ids += tok.encode(text[pos:start], add_special_tokens=False)
        rest, cut = content, 0
        while True:
            hits = [(rest.find(lit, cut), lit) for lit in literals if rest.find(lit, cut) >= 0]
            if not hits:
                break
            at, lit = min(hits)
            ids += tok.encode(rest[cut:at], add_special_tokens=False) + tok.encode(lit, allow_special_tokens=False)
            cut = at + len(lit)
        ids += tok.encode(rest[cut:], add_special_tokens=False)
        pos = start + len(content)
    return ids + tok.encode(text[pos:], add_special_tokens=False)


def test_the_fixture_has_the_real_format(kimi_tiktoken_dir, kimi):
    tok, _ = kimi
    files = {p.name for p in kimi_tiktoken_dir.iterdir()}
    assert {
        "tiktoken.model",
        "tokenization_kimi.py",
        "tokenizer_config.json",
    } <= files and "tokenizer.json" not in files
    assert "AutoTokenizer" in json.loads((kimi_tiktoken_dir / "tokenizer_config.json").read_text())["auto_map"]
    assert getattr(tok, "backend_tokenizer", None) is None and tiktoken_model(tok) is not None
    assert (
        len(tok) == 163840
        and tok.convert_tokens_to_ids("<think>") == 163606
        and tok.convert_tokens_to_ids("</think>") == 163607
    )
    assert len(tiktoken_model(tok).special_tokens_set) == 256
    # Its own encode matches special-token text by default, as Kimi's does.
    assert tok.encode("<|im_end|>") == [163586] and tok.encode("<|im_end|>", allow_special_tokens=False) != [163586]


def test_it_loads_as_autotokenizer_does_without_importing_torch(kimi_tiktoken_dir, kimi):
    """The tokenizer's own class, the same as AutoTokenizer's, and no torch on the way (a generate job
    loads it to make a conversation's later turns while its requests are in flight)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    tok, _ = kimi
    auto = AutoTokenizer.from_pretrained(str(kimi_tiktoken_dir), trust_remote_code=True)
    assert type(tok).__name__ == type(auto).__name__ == "TikTokenTokenizer"
    text = "Hello <|im_end|> 中文 🙂\n\n  tabs\t"
    assert tok.encode(text) == auto.encode(text) and len(tok) == len(auto)
    code = (
        "import sys; from eagle3_datagen.tokens.vocabulary import load_tokenizer; from eagle3_datagen.settings import "
        f"ModelProfile; load_tokenizer(ModelProfile(name='k', tokenizer={str(kimi_tiktoken_dir)!r}, "
        "context_length=8, trust_remote_code=True)); print('torch' in sys.modules)"
    )
    scripts = str(Path(__file__).resolve().parents[2] / "scripts")
    env = {**os.environ, "PYTHONPATH": scripts}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


def test_it_loads_only_with_trust_remote_code(kimi_tiktoken_dir):
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_tokenizer(ModelProfile(name="k", tokenizer=str(kimi_tiktoken_dir), context_length=8))


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
def test_prompt_ids_are_the_tokenizers_own_and_end_with_think(kimi, case):
    tok, profile = kimi
    messages, tools, literals = CONVERSATIONS[case]
    [row] = ChatTokenizer(tok, profile).tokenize([messages], [tools])
    assert row.error is None and row.has_literal_control_text == bool(literals)
    assert row.prompt_ids == reference_ids(tok, messages, tools, literals, thinking=True)
    assert row.prompt_ids[-1] == 163606


def test_every_special_id_is_protected_not_only_the_named_ones(kimi):
    tok, profile = kimi
    spans = ControlText(tok).spans("a <|reserved_token_163700|> b <|im_middle|> c [EOS]")
    assert len(spans) == 3
    [row] = ChatTokenizer(tok, profile).tokenize(
        [[{"role": "user", "content": "x <|reserved_token_163700|> y"}]], [None]
    )
    assert 163700 not in row.prompt_ids


def test_batches_and_tools_groups_give_the_same_ids_as_one_at_a_time(kimi):
    tok, profile = kimi
    chat = ChatTokenizer(tok, profile)
    rows = chat.tokenize([c[0] for c in CONVERSATIONS], [c[1] for c in CONVERSATIONS])
    assert [r.prompt_ids for r in rows] == [chat.tokenize([c[0]], [c[1]])[0].prompt_ids for c in CONVERSATIONS]


def test_a_conversation_the_template_cannot_render_fails_alone(kimi):
    tok, profile = kimi
    bad = [
        {"role": "user", "content": "ok"},
        {"role": "assistant", "tool_calls": [{"function": None}]},
        {"role": "user", "content": "x"},
    ]
    rows = ChatTokenizer(tok, profile).tokenize([CONVERSATIONS[0][0], bad, CONVERSATIONS[1][0]], [None, None, None])
    assert rows[1].error and not rows[1].prompt_ids
    assert rows[0].error is None and rows[0].prompt_ids[-1] == 163606 and rows[2].error is None


def test_decoding_keeps_tool_call_tokens_and_drops_specials_when_asked(kimi):
    """What SGLang's detokenizer does for this tokenizer: skip_special_tokens drops the named specials
    (<|im_end|>) but not the tool-call section tokens, which are added but not special."""
    tok, _ = kimi
    section = list(range(163595, 163600))
    ids = tok.encode("Hi") + section + [163586]
    kept = tok.decode(ids, skip_special_tokens=True)
    assert kept == "Hi" + "".join(tok.convert_ids_to_tokens(section))
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_end|>")


def test_the_fast_path_is_used_only_where_it_equals_transformers_path(kimi):
    from eagle3_datagen.tokens.encoding import TiktokenPath

    tok, _ = kimi
    assert TiktokenPath.applies(tok)

    class AddsBos(type(tok)):
        def encode(self, text, **kwargs):  # a TikToken tokenizer whose plain encode adds BOS
            return ([self.bos_token_id] if not kwargs else []) + super().encode(text, **kwargs)

    tok.__class__ = AddsBos
    try:
        assert not TiktokenPath.applies(tok)
    finally:
        tok.__class__ = AddsBos.__mro__[1]
