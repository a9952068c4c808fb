"""check_sequences: each invariant of DESIGN §5 catches its violation, and names the row and rule."""

import json

import pytest

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.steps.check_sequences import check_rows as check_sequences
from eagle3_datagen.tokens.templating import ChatTokenizer
from eagle3_datagen.tokens.vocabulary import token_id


@pytest.fixture(scope="module")
def kimi(kimi_tokenizer_dir, kimi_tokenizer):
    profile = ModelProfile(
        name="kimi",
        tokenizer=str(kimi_tokenizer_dir),
        context_length=4096,
        stop_tokens=("<|im_end|>",),
        chat_template_kwargs={"thinking": True},
        prompt_suffix=("<think>",),
        prompt_only_tokens=("<think>",),
        reasoning_end="</think>",
    )
    return kimi_tokenizer, profile


def make_row(tok, profile, row_id, text="What is 2+2?"):
    messages = [{"role": "user", "content": text}]
    prompt_ids = ChatTokenizer(tok, profile).tokenize([messages], [None])[0].prompt_ids
    answer = (
        tok.encode("Adding.", add_special_tokens=False)
        + [token_id(tok, "</think>")]
        + tok.encode("4", add_special_tokens=False)
        + [token_id(tok, "<|im_end|>")]
    )
    gen = {
        "id": row_id,
        "sample_index": 0,
        "turn": 0,
        "messages": json.dumps(messages),
        "tools": "",
        "status": "ok",
        "prompt_ids": prompt_ids,
        "output_ids": answer,
        "finish_type": "stop",
        "finish_matched": str(answer[-1]),
        "max_new_tokens": 64,
    }
    return gen


def run(tok, profile, mutate):
    gen = make_row(tok, profile, "r1")
    mutate(gen, tok)
    return check_sequences([gen], tokenizer=tok, profile=profile)


def test_a_well_formed_row_passes(kimi):
    tok, profile = kimi
    report = run(tok, profile, lambda g, t: None)
    assert report.checked == 1 and report.violations == []


@pytest.mark.parametrize(
    "rule, mutate",
    [
        (
            "prompt_matches_template",
            lambda g, t: g.update(prompt_ids=g["prompt_ids"][:3] + [g["prompt_ids"][3] + 1] + g["prompt_ids"][4:]),
        ),
        ("prompt_suffix", lambda g, t: g.update(prompt_ids=g["prompt_ids"][:-1])),
        ("no_prompt_only_tokens", lambda g, t: g.update(output_ids=[token_id(t, "<think>")] + g["output_ids"])),
        ("ends_with_stop", lambda g, t: g.update(output_ids=g["output_ids"][:-1], finish_matched="")),
        ("finish_matches_output", lambda g, t: g.update(finish_matched="7")),
        ("ids_in_vocabulary", lambda g, t: g.update(output_ids=[len(t) + 5] + g["output_ids"])),
        ("within_budget", lambda g, t: g.update(max_new_tokens=2)),
    ],
)
def test_each_violation_is_caught_and_named(kimi, rule, mutate):
    tok, profile = kimi
    report = run(tok, profile, mutate)
    assert rule in {v["rule"] for v in report.violations}
    message = report.message()
    assert "r1.0" in message and rule in message


def test_a_length_finish_needs_no_stop_token(kimi):
    tok, profile = kimi
    report = run(
        tok, profile, lambda g, t: g.update(output_ids=g["output_ids"][:-1], finish_type="length", finish_matched="")
    )
    assert report.violations == []


def test_rows_that_were_not_generated_are_not_checked(kimi):
    tok, profile = kimi
    gen = make_row(tok, profile, "r1")
    skipped = dict(gen, status="skipped", prompt_ids=[], output_ids=[])
    report = check_sequences([gen, skipped], tokenizer=tok, profile=profile)
    assert report.checked == 1 and report.violations == []
