"""The tiny demo model, trained on the Kimi-shaped tokenizer's format (minutes on two cores):
generates in that format with transformers."""

import json
from pathlib import Path

import pytest

from parser_corpus import WEATHER_TOOL

pytestmark = pytest.mark.slow


def _render(tok, messages, **kwargs) -> list[int]:
    return tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)


def test_demo_model_generates(demo_model_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(demo_model_dir)
    assert config.model_type == "qwen3"
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (2, 64, 163840)
    assert config.eos_token_id == 163585 and config.pad_token_id == 163839  # [EOS], as Kimi-K2.5's config.json
    gen_cfg = json.loads((demo_model_dir / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == 163586  # the turn's end, where generate() stops

    tok = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir).eval()
    prompts = [
        _render(tok, [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True),
        _render(
            tok,
            [{"role": "user", "content": "What's the weather in Paris?"}],
            tools=[WEATHER_TOOL],
            add_generation_prompt=True,
        ),
    ]
    think_end = tok.convert_tokens_to_ids("</think>")
    outputs = []
    for ids in prompts:
        assert ids[-1] == tok.convert_tokens_to_ids("<think>")
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=64,
                do_sample=False,
            )
        new = out[0, len(ids) :].tolist()
        assert new and all(0 <= t < 163840 for t in new)
        outputs.append(new)
    # the format training took: a plain question gets reasoning, </think>, an answer, <|im_end|>
    assert think_end in outputs[0] and outputs[0][-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the turn's end
    assert think_end in outputs[1]
