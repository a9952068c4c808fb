"""The quality gate: the loop detector on its labelled corpus (tests/quality_corpus.py: loops and
near-loops made on the ids of real answers, both tokenizers; legitimate repetition written and taken
from real answers), the live watch, and each flag on Kimi-K2.5-shaped and Qwen3 rows built with the
real chat templates."""

import numpy as np
import pytest

from eagle3_datagen.quality.flags import LOOP_FINISH, QualityFacts, QualitySettings, row_flags
from eagle3_datagen.quality.loops import LiveLoopWatch, LoopSettings, find_loop
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens.token_facts import token_facts
from eagle3_datagen.tokens.vocabulary import load_tokenizer
from quality_corpus import PERIODS, legitimate, live_stop_at, loops, not_loops, segments, sharegpt_answers

SETTINGS = LoopSettings()
GOAL = 0.95  # recall on every loop class with at most 5 % of its tokens swapped


@pytest.fixture(scope="module", params=["qwen3", "kimi"])
def corpus(request):
    """(legitimate texts as (ids, at_budget) by class, loops) on one tokenizer: the first 300 ShareGPT
    conversations, and one loop per budget, onset class, period and swap rate."""
    from transformers import AutoTokenizer

    if request.param == "qwen3":
        tok = request.getfixturevalue("qwen3_tokenizer")
    else:
        tok = AutoTokenizer.from_pretrained(str(request.getfixturevalue("kimi_tiktoken_dir")), trust_remote_code=True)
    texts = not_loops()
    texts["sharegpt"] = sharegpt_answers(conversations=300)
    texts |= segments(texts["sharegpt"])
    answers = [tok.encode(t, add_special_tokens=False) for t in texts["sharegpt"][:200]]
    return legitimate(tok, texts), loops(answers, SETTINGS, seed=7)


def test_loops_and_near_loops_of_every_class_are_flagged(corpus):
    _, looped = corpus
    assert {item["period"] for item in looped} == set(PERIODS)
    classes: dict = {}
    for item in looped:
        found = find_loop(item["ids"], SETTINGS, at_budget=True)
        hits = classes.setdefault((item["onset_kind"], item["rate"]), [])
        hits.append(found is not None)
        if found is not None and item["rate"] == 0:
            assert found.start <= item["onset"], item  # found from where it began
            assert item["period"] % found.period == 0 and found.mismatches == 0
    for (onset, rate), hits in classes.items():
        if onset != "late_any" and rate <= 0.05:
            assert sum(hits) >= GOAL * len(hits), (onset, rate, sum(hits), len(hits))
    # A fifth of the tokens swapped is past what max_mismatch allows: text, not a loop.
    assert sum(classes[("early", 0.2)]) <= 0.05 * len(classes[("early", 0.2)])


def test_legitimate_repetition_is_not_flagged_nor_stopped(corpus):
    texts, _ = corpus
    assert len(texts["sharegpt"]) > 500 and len(texts["real tables"]) > 20 and len(texts["real lists"]) > 100
    assert "song with chorus, cut at its end by a budget" in texts
    for source, items in texts.items():
        for ids, at_budget in items:
            assert find_loop(ids, SETTINGS, at_budget=at_budget) is None, source
            if not at_budget:
                assert live_stop_at(ids, SETTINGS) is None, source


def test_the_written_repetition_is_repetitive_enough_to_matter(corpus):
    """The legitimate corpus is not trivially clean: with far lower thresholds it would be flagged."""
    texts, _ = corpus
    loose = LoopSettings(min_tokens=32, min_repeats=2)
    assert find_loop(texts["empty markdown table"][0][0], loose) is not None
    # A counter in every copy (a numbered list, a times table) is no loop even with a lax share.
    lax = LoopSettings(min_tokens=32, min_repeats=8, max_mismatch=0.4)
    assert find_loop(texts["numbered list"][0][0], lax) is None


def test_live_watch_stops_a_loop_soon_after_its_onset_and_agrees_with_the_flag(corpus):
    _, looped = corpus
    live = SETTINGS.live()
    checked = 0
    for item in looped:
        room = item["budget"] - item["onset"]
        if item["budget"] > 4096 or item["rate"] > 0.05 or room < 2 * live.need(item["period"]):
            continue
        at = live_stop_at(item["ids"], SETTINGS, interval=32)
        assert at is not None, {k: item[k] for k in ("budget", "period", "onset", "rate")}
        assert at - item["onset"] <= 1.5 * live.need(item["period"]) + 32 + 2 * item["period"], item
        assert find_loop(item["ids"][:at], SETTINGS) is not None  # what was stopped is flagged
        checked += 1
    assert checked > 30


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


QWEN3_EOS = {**QWEN3, "eos_tokens": ["<|endoftext|>"]}


@pytest.fixture(scope="module", params=["with generation_config.json", "tokenizer alone"])
def qwen3(request, qwen3_tokenizer_dir, tmp_path_factory):
    """The real Qwen3 tokenizer with the profile of config/qwen3.yaml (<|endoftext|> an eos, not a turn
    end), beside the generation_config.json Qwen3's model repositories ship (eos_token_id [151645,
    151643]: <|im_end|> and <|endoftext|>), or alone."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("qwen3") / "model"
    shutil.copytree(qwen3_tokenizer_dir, folder)
    if request.param == "with generation_config.json":
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    profile = profile_for(folder, **QWEN3_EOS)
    tok = load_tokenizer(profile)
    return tok, QualityFacts.from_token_facts(token_facts(tok, profile))


def test_eos_tokens_stop_generation_but_do_not_end_a_turn(qwen3):
    tok, facts = qwen3
    im_end, endoftext = tid(tok, "<|im_end|>"), tid(tok, "<|endoftext|>")
    assert facts.turn_end_ids == {im_end} and {im_end, endoftext} <= facts.stop_ids
    folder = tok.name_or_path
    sent = token_facts(tok, profile_for(folder, **QWEN3_EOS))
    assert sent["stop_token_ids"] == [im_end, endoftext] and sent["turn_end_ids"] == [im_end]
    # Without model.eos_tokens, <|endoftext|> stops only where a generation_config.json names it.
    alone = token_facts(tok, profile_for(folder, **QWEN3))
    has_config = alone["stop_set"]["sources"]["generation_config.json"] is not None
    assert (endoftext in alone["stop_set"]["ids"]) == has_config
    with pytest.raises(ValueError, match="both name"):
        profile_for(folder, **{**QWEN3, "eos_tokens": ["<|im_end|>"]})


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
    # The turn ended inside the reasoning: no answer, and the reasoning never closed.
    assert codes(prompt, [im_end], "stop", facts) == ["stopped_in_reasoning"]
    assert codes(prompt, reasoning + [im_end], "stop", facts) == ["stopped_in_reasoning"]
    assert codes(instant, reasoning + [im_end], "stop", facts) == []


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
