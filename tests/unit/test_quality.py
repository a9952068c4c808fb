"""The quality gate: the loop detector on real text (loops of many periods and onsets flagged,
legitimate repetition not), the live watch, and each flag on Kimi-K2.5-shaped and Qwen3 rows built
with the real chat templates."""

import numpy as np
import pytest

from eagle3_datagen.quality.flags import LOOP_FINISH, QualityFacts, QualitySettings, row_flags
from eagle3_datagen.quality.loops import LiveLoopWatch, LoopSettings, find_loop
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens.token_facts import token_facts
from eagle3_datagen.tokens.vocabulary import load_tokenizer
from quality_corpus import PERIODS, live_stop_at, loops, not_loops

SETTINGS = LoopSettings()


@pytest.fixture(scope="module")
def corpus(qwen3_tokenizer):
    """(not-loop texts as ids by source, loops): the first 300 ShareGPT conversations and the rest."""
    from quality_corpus import sharegpt_answers

    texts = not_loops()
    texts["sharegpt"] = sharegpt_answers(conversations=300)
    encoded = {k: [qwen3_tokenizer.encode(t, add_special_tokens=False) for t in v] for k, v in texts.items()}
    return encoded, loops(qwen3_tokenizer, texts["sharegpt"], 240, seed=7)


def test_loops_of_every_period_and_onset_are_flagged(corpus):
    _, looped = corpus
    assert {item["period"] for item in looped} == set(PERIODS)
    for item in looped:
        found = find_loop(item["ids"], SETTINGS)
        if found is None:
            # Only a loop whose n-gram tokenized longer than max_period may escape, and it is one.
            longer = find_loop(item["ids"], LoopSettings(max_period=4 * SETTINGS.max_period))
            assert item["kind"] == "text repeated" and longer is not None and longer.period > SETTINGS.max_period
            continue
        assert found.period <= max(item["period"], 1) * 2 or item["kind"] == "text repeated"
        assert found.start <= item["onset"] + found.period  # the loop is found from where it began
        if item["kind"] == "token n-gram":
            assert found.period == min(
                p
                for p in range(1, item["period"] + 1)
                if item["period"] % p == 0 and _periodic(item["ids"][item["onset"] - item["period"] :], p)
            )


def _periodic(ids, p):
    return all(ids[i] == ids[i - p] for i in range(p, len(ids)))


def test_legitimate_repetition_is_not_flagged_nor_stopped(corpus):
    encoded, _ = corpus
    assert len(encoded["sharegpt"]) > 500 and "song with chorus" in encoded and "ascii art" in encoded
    for source, items in encoded.items():
        for ids in items:
            assert find_loop(ids, SETTINGS) is None, source
            assert live_stop_at(ids, SETTINGS) is None, source


def test_the_written_repetition_is_repetitive_enough_to_matter(corpus):
    """The legitimate corpus is not trivially clean: with a far lower threshold it would be flagged."""
    encoded, _ = corpus
    loose = LoopSettings(min_tokens=32, min_repeats=2)
    assert find_loop(encoded["empty markdown table"][0], loose) is not None


def test_live_watch_stops_a_loop_soon_after_its_onset_and_agrees_with_the_flag(corpus):
    _, looped = corpus
    for item in looped:
        at = live_stop_at(item["ids"], SETTINGS, interval=32)
        if find_loop(item["ids"], SETTINGS) is None:
            continue
        assert at is not None
        need = SETTINGS.live().need(min(SETTINGS.max_period, item["period"] * 2))
        assert at - item["onset"] <= need + 32 + 2 * item["period"], item
        assert find_loop(item["ids"][:at], SETTINGS) is not None  # what was stopped is flagged


def test_live_watch_keeps_only_its_window():
    watch = LiveLoopWatch(SETTINGS)
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert watch.feed(rng.integers(0, 50_000, 64).tolist()) is None
    assert watch.n == 200 * 64 and len(watch.tail) == SETTINGS.live().window
    for _ in range(40):
        found = watch.feed([7, 8, 9] * 11)
        if found:
            break
    assert found is not None and found.period == 3 and found.start >= 200 * 64


# --- flags on rows made with the real chat templates ---------------------------------------------


def profile_for(path, **model) -> ModelProfile:
    return ModelProfile.from_config({"name": "m", "tokenizer": str(path), "context_length": 4096, **model})


KIMI = {"stop_tokens": ["<|im_end|>"], "reasoning_end": "</think>", "prompt_suffix": ["<think>"]}
QWEN3 = {"stop_tokens": ["<|im_end|>"], "reasoning_end": "</think>"}


@pytest.fixture(scope="module", params=["kimi_tiktoken", "kimi_shaped"])
def kimi(request):
    path = request.getfixturevalue(f"{request.param}_dir" if request.param == "kimi_tiktoken" else "kimi_tokenizer_dir")
    profile = profile_for(path, trust_remote_code=request.param == "kimi_tiktoken", **KIMI)
    tok = load_tokenizer(profile)
    return tok, QualityFacts.from_token_facts(token_facts(tok, profile))


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir, tmp_path_factory):
    """The real Qwen3 tokenizer beside the generation_config.json Qwen3's model repositories ship
    (eos_token_id [151645, 151643]: <|im_end|> and <|endoftext|>)."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("qwen3") / "model"
    shutil.copytree(qwen3_tokenizer_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    profile = profile_for(folder, **QWEN3)
    tok = load_tokenizer(profile)
    return tok, QualityFacts.from_token_facts(token_facts(tok, profile))


def prompt_of(tok, **kwargs):
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )
    return list(ids)


def text(tok, s):
    return tok.encode(s, add_special_tokens=False)


def codes(prompt, output, finish, facts, loop=SETTINGS):
    return [f.code for f in row_flags(prompt, output, finish, facts, loop)]


def tid(tok, token):
    return tok.convert_tokens_to_ids(token)


def test_kimi_rows(kimi):
    tok, facts = kimi
    prompt = prompt_of(tok, thinking=True)
    think_end, im_end, eos = tid(tok, "</think>"), tid(tok, "<|im_end|>"), tid(tok, "[EOS]")
    assert prompt[-1] == tid(tok, "<think>")
    reasoning = text(tok, "The user asks for 2+2. That is 4.")
    assert codes(prompt, reasoning + [think_end] + text(tok, "4") + [im_end], "stop", facts) == []
    assert codes(prompt, reasoning, "length", facts) == ["unfinished_reasoning"]
    assert codes(prompt, reasoning + [think_end] + text(tok, "The answer"), "length", facts) == []
    assert codes(prompt, reasoning + [think_end, im_end], "stop", facts) == ["empty_answer"]
    assert codes(prompt, reasoning + [think_end] + text(tok, "\n\n  \n") + [im_end], "stop", facts) == ["empty_answer"]
    tool_call = (
        [tid(tok, "<|tool_calls_section_begin|>")]
        + text(tok, "functions.add:0")
        + [tid(tok, "<|tool_calls_section_end|>")]
    )
    assert codes(prompt, reasoning + [think_end] + tool_call + [im_end], "stop", facts) == []
    assert codes(prompt, reasoning + [think_end] + text(tok, "4") + [eos], "stop", facts) == ["unexpected_stop"]
    looped = reasoning + text(tok, " Let me check again.") * 200
    assert codes(prompt, looped, "length", facts) == ["repetition_loop", "unfinished_reasoning"]
    assert codes(prompt, looped[:600], LOOP_FINISH, facts) == ["repetition_loop", "unfinished_reasoning"]
    # Instant mode: the prompt closes the reasoning itself; a cut answer is not unfinished reasoning.
    instant = prompt + [think_end]
    assert codes(instant, text(tok, "The answer is"), "length", facts) == []
    assert codes(instant, [im_end], "stop", facts) == ["empty_answer"]  # closed in the prompt, then nothing
    assert codes(instant, text(tok, "4") + [im_end], "stop", facts) == []
    assert codes(prompt, [im_end], "stop", facts) == []  # still inside the reasoning: not an answer yet


def test_qwen3_rows(qwen3):
    tok, facts = qwen3
    think, think_end, im_end = tid(tok, "<think>"), tid(tok, "</think>"), tid(tok, "<|im_end|>")
    prompt = prompt_of(tok, enable_thinking=True)
    assert think not in prompt[-4:]  # Qwen3 writes its own <think>
    reasoning = [think] + text(tok, "\nOkay, 2+2 is 4.\n")
    assert codes(prompt, reasoning, "length", facts) == ["unfinished_reasoning"]
    assert codes(prompt, reasoning + [think_end] + text(tok, "\n\n4") + [im_end], "stop", facts) == []
    assert codes(prompt, reasoning + [think_end] + text(tok, "\n\n") + [im_end], "stop", facts) == ["empty_answer"]
    assert codes(prompt, text(tok, "4 is the answer"), "length", facts) == []  # no reasoning opened
    endoftext = tid(tok, "<|endoftext|>")
    assert endoftext in facts.stop_ids and codes(
        prompt, reasoning + [think_end] + text(tok, "4") + [endoftext], "stop", facts
    ) == ["unexpected_stop"]
    no_think = prompt_of(tok, enable_thinking=False)
    assert no_think[-1] != think and think_end in no_think[-6:]
    assert codes(no_think, text(tok, "4 is"), "length", facts) == []


def test_a_model_without_reasoning_has_empty_answers_too(qwen3):
    tok, facts = qwen3
    plain = QualityFacts(facts.turn_end_ids, facts.stop_ids, whitespace_ids=facts.whitespace_ids)
    prompt, im_end = prompt_of(tok, enable_thinking=False), tid(tok, "<|im_end|>")
    assert codes(prompt, text(tok, " \n") + [im_end], "stop", plain) == ["empty_answer"]
    assert codes(prompt, text(tok, "Four.") + [im_end], "stop", plain) == []


def test_policies_and_live_stop_setting():
    default = QualitySettings.from_config()
    assert default.stops_loops_live
    keep = QualitySettings.from_config({"policies": {"repetition_loop": "keep"}})
    assert not keep.stops_loops_live
    flags = row_flags([1], [5, 6] * 400, "length", QualityFacts(frozenset({9}), frozenset({9})), SETTINGS)
    assert [f.code for f in flags] == ["repetition_loop"]
    assert default.quarantined(flags).code == "repetition_loop" and keep.quarantined(flags) is None
