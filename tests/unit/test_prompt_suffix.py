"""A model profile whose prompt_suffix its chat template does not render is refused by
tokenize_prompts on a mode's first prompts, before anything is generated; a single prompt that alone
ends otherwise is a row error, skipped with its reason. On the real tokenizers: Kimi-K2.5's format
(TikToken, remote code) with its production profile, and Qwen3."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import qwen3_model, tokenize_file
from eagle3_datagen.settings import defaults
from eagle3_datagen.steps import tokenize_prompts as step
from eagle3_datagen.storage.tables import read_rows
from eagle3_datagen.tokens.prompt_suffix import SuffixCheck, SuffixMismatch

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"question number {i}?"}]} for i in range(40)]


def kimi_model(kimi_tiktoken_dir, **modes) -> dict:
    """config/kimi-k2.5.yaml's model profile on the Kimi-format TikToken fixture, `modes` laid over its modes."""
    model = yaml.safe_load((ROOT / "config" / "kimi-k2.5.yaml").read_text())["model"]
    for mode, spec in modes.items():
        model["modes"][mode] = {**model["modes"][mode], **spec}
    return defaults("model", **{**model, "tokenizer": str(kimi_tiktoken_dir), "context_length": 4096})


def tokenize(tmp_path, model, rows=ROWS, **settings):
    source = tmp_path / "p.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tokenize_file(source, tmp_path / "p.parquet", model, **settings)


@pytest.fixture
def batches(monkeypatch):
    """How many batches tokenize_prompts rendered."""
    seen = []
    original = step.build_prompt_rows
    monkeypatch.setattr(
        step, "build_prompt_rows", lambda rows, *a, **k: seen.append(len(rows)) or original(rows, *a, **k)
    )
    return seen


def test_kimis_production_profile_renders_its_suffixes(tmp_path, kimi_tiktoken_dir):
    rows = read_rows(tokenize(tmp_path, kimi_model(kimi_tiktoken_dir), mode_mix="thinking:0.5,instant:0.5"))
    assert {r["mode"] for r in rows} == {"thinking", "instant"} and all(r["status"] == "ok" for r in rows)


def test_a_wrong_mode_suffix_on_kimis_tiktoken_tokenizer_is_refused_on_the_first_rows(
    tmp_path, kimi_tiktoken_dir, batches
):
    """Thinking mode's template ends <think>; a profile saying <think></think> (instant's) is refused
    after the mode's first conversations, long before the category's last batch."""
    model = kimi_model(kimi_tiktoken_dir, thinking={"prompt_suffix": ["<think>", "</think>"]})
    with pytest.raises(SuffixMismatch) as refused:
        tokenize(tmp_path, model, mode_mix="thinking", batch={"rows": 2})
    text = str(refused.value)
    assert "mode thinking's prompt_suffix ['<think>', '</think>'] (model.modes.thinking.prompt_suffix)" in text, text
    # What the template rendered, as token strings: the end every one of the first prompts shares.
    assert (
        "the first 8 all end [" in text
        and "'<|im_end|>', '<|im_assistant|>', 'assistant', '<|im_middle|>', '<think>']" in text
    )
    assert "Set model.modes.thinking.prompt_suffix to" in text and "nothing was generated" in text
    assert sum(batches) == SuffixCheck.FIRST < len(ROWS)  # decided on the first rows, not the whole file
    assert not (tmp_path / "p.parquet").exists()


def test_a_wrong_suffix_on_qwen3_is_refused_naming_model_prompt_suffix(tmp_path, qwen3_tokenizer_dir):
    model = qwen3_model(qwen3_tokenizer_dir, prompt_suffix=["<think>", "Ċ"])
    with pytest.raises(SuffixMismatch) as refused:
        tokenize(tmp_path, model, rows=ROWS[:3])  # fewer rows than FIRST: decided at the end
    text = str(refused.value)
    assert "mode default's prompt_suffix ['<think>', 'Ċ'] (model.prompt_suffix)" in text, text
    assert "the first 3 all end [" in text and "'<|im_end|>', 'Ċ', '<|im_start|>', 'assistant', 'Ċ']" in text, text
    right = qwen3_model(qwen3_tokenizer_dir, prompt_suffix=["<|im_start|>", "assistant", "Ċ"])
    assert all(r["status"] == "ok" for r in read_rows(tokenize(tmp_path, right, rows=ROWS[:3])))


def test_a_mode_inheriting_a_wrong_suffix_names_both_keys(tmp_path, qwen3_tokenizer_dir):
    model = qwen3_model(qwen3_tokenizer_dir, prompt_suffix=["</think>"], modes={"plain": {}})
    with pytest.raises(SuffixMismatch, match=r"\(model.prompt_suffix \(or model.modes.plain.prompt_suffix\)\)"):
        tokenize(tmp_path, model, rows=ROWS[:2])


def test_one_row_the_template_ends_otherwise_is_skipped_with_its_reason(tmp_path, qwen3_tokenizer_dir):
    """A template that ends one conversation differently (here: on what its last message says) while
    it ends the others with the suffix: that row is skipped, the category goes on."""
    odd = tmp_path / "qwen3-odd"
    shutil.copytree(qwen3_tokenizer_dir, odd)
    config = json.loads((odd / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace(
        "{%- if add_generation_prompt %}",
        "{%- if add_generation_prompt and 'odd one' in messages[-1].content %}{{- '<|im_start|>user' }}"
        "{%- elif add_generation_prompt %}",
    )
    assert config["chat_template"].count("'odd one'") == 1
    (odd / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [*ROWS[:5], {"id": "odd", "messages": [{"role": "user", "content": "the odd one"}]}, *ROWS[5:12]]
    model = qwen3_model(odd, prompt_suffix=["<|im_start|>", "assistant", "Ċ"])
    table = {r["id"]: r for r in read_rows(tokenize(tmp_path, model, rows=rows))}
    assert table["odd"]["status"] == "skipped", table["odd"]
    assert "p.jsonl:6: the prompt ends" in table["odd"]["reason"]
    assert (
        "not with mode default's prompt_suffix ['<|im_start|>', 'assistant', 'Ċ'] as the others do"
        in (table["odd"]["reason"])
    )
    assert all(r["status"] == "ok" for rid, r in table.items() if rid != "odd")
