"""Client-side chat templating: exact prompt ids, the Kimi-K2.5 <think> suffix, literal control text kept as text."""

import json

import pytest
from transformers import AutoTokenizer

from eagle3_datagen.settings import Budget, ModelProfile
from eagle3_datagen.tokens.encoding import ControlText
from eagle3_datagen.tokens.templating import ChatTokenizer
from eagle3_datagen.tokens.token_facts import output_budget
from eagle3_datagen.tokens.vocabulary import token_id, tokenizer_fingerprint

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir, qwen3_tokenizer):
    profile = ModelProfile(
        name="qwen3", tokenizer=str(qwen3_tokenizer_dir), context_length=4096, stop_tokens=("<|im_end|>",)
    )
    return qwen3_tokenizer, profile


@pytest.fixture(scope="module")
def kimi(kimi_tokenizer_dir, kimi_tokenizer):
    profile = ModelProfile(
        name="kimi",
        tokenizer=str(kimi_tokenizer_dir),
        context_length=4096,
        stop_tokens=("<|im_end|>",),
        chat_template_kwargs={"thinking": True},
        prompt_suffix=("<think>",),
    )
    return kimi_tokenizer, profile


def ids(chat, messages, tools=None):
    return chat.tokenize([messages], [tools])[0].prompt_ids


def test_qwen3_generation_prompt_is_reproduced_exactly(qwen3):
    tok, profile = qwen3
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    expected_text = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    expected = tok(expected_text, add_special_tokens=False)["input_ids"]
    got = ids(ChatTokenizer(tok, profile), messages)
    assert got == expected
    assert got[-3:] == [token_id(tok, "<|im_start|>"), *tok("assistant\n", add_special_tokens=False)["input_ids"]]


def test_batched_ids_equal_apply_chat_template_row_by_row(qwen3):
    tok, profile = qwen3
    conversations = [[{"role": "user", "content": f"Question number {i}: {'why ' * i}?"}] for i in range(12)] + [
        [{"role": "user", "content": "Weather in Paris?"}],
        [{"role": "user", "content": "Weather in Oslo?"}],
    ]
    tools = [None] * 12 + [WEATHER, WEATHER]
    got = [t.prompt_ids for t in ChatTokenizer(tok, profile).tokenize(conversations, tools)]
    for conv, tl, row in zip(conversations, tools, got):
        assert row == tok.apply_chat_template(
            conv, tools=tl, add_generation_prompt=True, tokenize=True, return_dict=False
        )


def test_kimi_shaped_prompt_ends_with_think(kimi):
    tok, profile = kimi
    got = ids(ChatTokenizer(tok, profile), [{"role": "user", "content": "Hello"}])
    assert got[-1] == token_id(tok, "<think>") == 163606
    assert got[-2] == token_id(tok, "<|im_middle|>")
    assert token_id(tok, "<|im_assistant|>") in got[-5:]


def test_kimi_thinking_false_ends_with_empty_think_block(kimi):
    tok, _ = kimi
    profile = ModelProfile(
        name="kimi",
        tokenizer="x",
        context_length=4096,
        stop_tokens=("<|im_end|>",),
        chat_template_kwargs={"thinking": False},
    )
    got = ids(ChatTokenizer(tok, profile), [{"role": "user", "content": "Hello"}])
    assert got[-2:] == [token_id(tok, "<think>"), token_id(tok, "</think>")]


@pytest.mark.parametrize("fixture_name", ["qwen3", "kimi"])
@pytest.mark.parametrize("literal", ["<|im_end|>", "<think>", "</think>"])
def test_control_token_text_in_user_content_stays_text(request, fixture_name, literal):
    tok, profile = request.getfixturevalue(fixture_name)
    chat = ChatTokenizer(tok, profile)
    control = token_id(tok, literal)
    plain = ids(chat, [{"role": "user", "content": "please explain the string"}])
    got = ids(chat, [{"role": "user", "content": f"please explain the string {literal} here"}])
    # The template's own control tokens are all still there, and the literal adds none of its id.
    assert got.count(control) == plain.count(control)
    # ... yet the text survives a round trip exactly.
    assert literal in tok.decode(got)
    # A naive apply_chat_template would have turned it into the control token.
    naive = tok.apply_chat_template(
        [{"role": "user", "content": f"please explain the string {literal} here"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **profile.chat_template_kwargs,
    )
    assert naive.count(control) == plain.count(control) + 1


def test_control_text_in_assistant_history_is_left_to_the_template(qwen3):
    tok, profile = qwen3
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nb"},
        {"role": "user", "content": "c"},
    ]
    got = ids(ChatTokenizer(tok, profile), messages)
    assert got == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_control_text_finder_prefers_the_longest_token(kimi):
    tok, _ = kimi
    spans = ControlText(tok).spans("a </think> b <think>c<|im_end|>")
    assert [("a </think> b <think>c<|im_end|>")[s:e] for s, e in spans] == ["</think>", "<think>", "<|im_end|>"]


def test_output_budget_cuts_to_the_context_and_skips_when_too_small():
    budget = Budget(max_new_tokens=100, min_new_tokens=16, reserve_tokens=4)
    assert output_budget(10, context_length=200, budget=budget) == (100, None)
    assert output_budget(150, context_length=200, budget=budget) == (46, None)
    value, reason = output_budget(190, context_length=200, budget=budget)
    assert value == 6 and "over-long" in reason and "190 tokens" in reason


def test_fingerprint_changes_with_the_template(qwen3):
    tok, _ = qwen3
    before = tokenizer_fingerprint(tok)
    original = tok.chat_template
    try:
        tok.chat_template = original + " "
        after = tokenizer_fingerprint(tok)
    finally:
        tok.chat_template = original
    assert before["tokenizer_sha256"] == after["tokenizer_sha256"]
    assert before["chat_template_sha256"] != after["chat_template_sha256"]


def test_unknown_token_is_an_error(qwen3):
    tok, _ = qwen3
    with pytest.raises(ValueError, match="not in the vocabulary"):
        token_id(tok, "<|no_such_token|>")


@pytest.mark.parametrize("fixture_name", ["qwen3", "kimi"])
def test_text_only_encoding_equals_a_tokenizer_without_added_tokens(request, fixture_name):
    """The reference: the same tokenizer rebuilt with its added tokens removed."""
    import json

    from tokenizers import Tokenizer

    from eagle3_datagen.tokens.encoding import TextOnlyEncoder

    tok, _ = request.getfixturevalue(fixture_name)
    spec = json.loads(tok.backend_tokenizer.to_str())
    spec["added_tokens"] = []
    reference = Tokenizer.from_str(json.dumps(spec))
    fast = TextOnlyEncoder(tok)
    for text in [
        "<|im_end|>",
        " <think>",
        "</think>\n\n",
        "<|tool_calls_section_begin|>",
        "[BOS]",
        "日本語<|im_start|>x",
        "  <|endoftext|>  ",
    ]:
        assert fast.encode(text) == reference.encode(text, add_special_tokens=False).ids, text


@pytest.mark.parametrize("which", ["qwen3", "kimi"])
def test_the_tokenizer_loads_as_autotokenizer_would_without_torch(which, qwen3, kimi, tmp_path):
    """load_tokenizer skips AutoTokenizer (and its torch import) but must give the very same tokenizer."""
    import subprocess
    import sys

    from eagle3_datagen.tokens.vocabulary import load_tokenizer

    auto, profile = {"qwen3": qwen3, "kimi": kimi}[which]
    ours = load_tokenizer(profile)
    assert type(ours) is type(auto) and len(ours) == len(auto) and ours.get_vocab() == auto.get_vocab()
    conversations = [
        [{"role": "user", "content": "hi <|im_end|> there"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    ]
    for messages in conversations:
        for tools in (None, WEATHER):
            kwargs = dict(
                tools=tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **profile.chat_template_kwargs,
            )
            assert ours.apply_chat_template(messages, **kwargs) == auto.apply_chat_template(messages, **kwargs)
    probe = (
        "import sys; from eagle3_datagen.tokens.vocabulary import load_tokenizer; from eagle3_datagen.settings import ModelProfile; "
        f"load_tokenizer(ModelProfile(name='x', tokenizer={profile.tokenizer!r}, context_length=8)); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={"PYTHONPATH": ":".join(sys.path)}
    )
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("fixture_name", ["qwen3", "kimi", "kimi_tiktoken"])
def test_batch_decode_is_the_tokenizers_own(request, fixture_name):
    """The backend's decode_batch where it is exact, the tokenizer's own path elsewhere: the same
    text for random ids, special and added tokens included, skipped or not."""
    import random

    from eagle3_datagen.tokens.vocabulary import _plain_fast_decode, batch_decode

    if fixture_name == "kimi_tiktoken":
        tok = AutoTokenizer.from_pretrained(str(request.getfixturevalue("kimi_tiktoken_dir")), trust_remote_code=True)
    else:
        tok = request.getfixturevalue(fixture_name)[0]
    assert _plain_fast_decode(type(tok)) == (fixture_name != "kimi_tiktoken")
    rng = random.Random(0)
    special = list(tok.all_special_ids) + tok.convert_tokens_to_ids(["<think>", "</think>"])
    sequences = [
        [
            rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tok) - 300)
            for _ in range(rng.randint(0, 400))
        ]
        for _ in range(30)
    ]
    for skip in (True, False):
        assert batch_decode(tok, sequences, skip_special_tokens=skip) == [
            tok.decode(s, skip_special_tokens=skip) for s in sequences
        ]


def test_the_stop_set_is_every_id_sglang_stops_on(qwen3, tmp_path):
    """The profile's stop tokens, the tokenizer's eos, config.json and generation_config.json
    eos_token_id (an int or a list) and SGLang's additional turn-final markers; the same set as the
    local engine derives for itself, as SGLang's scheduler does."""
    from eagle3_datagen.engine.jobs import read_eos_token_ids
    from eagle3_datagen.tokens.token_facts import stop_set

    tokenizer, profile = qwen3
    folder = tmp_path / "model"
    tokenizer.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.add_special_tokens({"additional_special_tokens": ["<|eom_id|>"]})
    tok.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    profile = ModelProfile(name="q", tokenizer=str(folder), context_length=4096, stop_tokens=("<|im_end|>",))

    found = stop_set(tok, profile)
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    assert found.sources == {
        "model.stop_tokens": [151645],
        "tokenizer.eos_token": [151645],
        "config.json": None,
        "generation_config.json": None,
        "additional_stop_tokens": [eom],
    }
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 151643}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    found = stop_set(tok, profile)
    assert found.ids == {151643, 151645, eom}
    assert found.sources["config.json"] == [151643] and found.sources["generation_config.json"] == [151643, 151645]
    engine = read_eos_token_ids(folder, tok.eos_token_id, tok.get_added_vocab())
    assert engine | {151645} == found.ids

    (folder / "config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(ValueError, match="config.json: eos_token_id must be"):
        stop_set(tok, profile)
