"""The demo's tiny model (no model with weights can be had without the Hugging Face hub):
:func:`build_demo_model_dir` writes the Kimi-shaped tokenizer and a tiny ``Qwen3ForCausalLM`` trained
for a few seconds on CPU on :func:`demo_conversations`, so that it emits Kimi-formatted outputs:
reasoning, ``</think>``, an answer or a tool-call section, ``<|im_end|>``; some prompts make it ramble
without ever closing the reasoning. Imports `demo.tokenizers` only (torch and transformers to train).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

from eagle3_datagen.demo.tokenizers import atomic_build, write_kimi_tokenizer

log = logging.getLogger(__name__)

_TOOL_SPECS: dict[str, tuple[str, dict[str, str]]] = {
    "get_weather": ("Get the current weather for a city.", {"city": "string"}),
    "search_web": ("Search the web and return the top results.", {"query": "string"}),
    "run_python": ("Run a Python snippet and return its output.", {"code": "string"}),
    "get_time": ("Get the current time in a timezone.", {"timezone": "string"}),
    "convert_currency": (
        "Convert an amount between currencies.",
        {"amount": "number", "from": "string", "to": "string"},
    ),
}

_CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Oslo", "Cairo", "Seoul", "Madrid"]
_QUERIES = ["latest Python release", "tallest mountain", "best pizza recipe", "speed of light"]
_SNIPPETS = ["print(2 ** 10)", "print(sum(range(10)))", "print('hello')", "print(len('abc'))"]
_ZONES = ["Europe/Paris", "Asia/Tokyo", "America/Lima", "UTC"]
_CURRENCIES = ["USD", "EUR", "JPY", "GBP"]
_CHAT_TOPICS = ["the ocean", "jazz music", "the moon", "coffee", "history of Rome", "cats", "winter"]
_CODE_REQUESTS = [
    ("reverses a string", "def reverse(s):\n    return s[::-1]"),
    ("adds two numbers", "def add(a, b):\n    return a + b"),
    ("checks if a number is even", "def is_even(n):\n    return n % 2 == 0"),
    ("returns the maximum of a list", "def largest(xs):\n    return max(xs)"),
]
_PONDER_TOPICS = ["infinity", "the meaning of life", "free will", "time itself", "nothingness"]
_RAMBLE_LINES = [
    "Hmm, wait. Let me reconsider this from the start.",
    "Actually, let me think about it again more carefully.",
    "But then again, maybe that is not right either.",
]
Example = tuple[list[int], int]  # a training example: prompt + completion ids, and the prompt's length


def _tool_schema(name: str) -> dict[str, Any]:
    desc, params = _TOOL_SPECS[name]
    schema = {"type": "object", "properties": {p: {"type": t} for p, t in params.items()}, "required": list(params)}
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}


def _tool_request(rng: random.Random, name: str) -> tuple[str, dict[str, Any], str]:
    """(user question, call arguments, short description) for a tool."""
    if name == "get_weather":
        city = rng.choice(_CITIES)
        q = rng.choice([f"What's the weather in {city}?", f"Is it raining in {city} right now?"])
        return q, {"city": city}, f"the weather in {city}"
    if name == "search_web":
        q = rng.choice(_QUERIES)
        return f"Search the web for the {q}.", {"query": q}, f"the {q}"
    if name == "run_python":
        code = rng.choice(_SNIPPETS)
        return f"Run this code and tell me the output: {code}", {"code": code}, "the output of some code"
    if name == "get_time":
        zone = rng.choice(_ZONES)
        return f"What time is it in {zone}?", {"timezone": zone}, f"the time in {zone}"
    amount = rng.randint(1, 500)
    a, b = rng.sample(_CURRENCIES, 2)
    return f"Convert {amount} {a} to {b}.", {"amount": amount, "from": a, "to": b}, f"{amount} {a} in {b}"


def _math_turn(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op, sym, val = rng.choice([("add", "+", a + b), ("multiply", "*", a * b), ("subtract", "-", a - b)])
    q = rng.choice([f"What is {a} {sym} {b}?", f"Compute {a} {sym} {b}.", f"Please {op} {a} and {b}."])
    reasoning = f"The user asks about arithmetic: {a} {sym} {b}. Let me work through it."
    return q, reasoning, f"The answer is {val}."


def _chat_turn(rng: random.Random) -> tuple[str, str, str]:
    topic = rng.choice(_CHAT_TOPICS)
    q = rng.choice([f"Tell me something about {topic}.", f"What do you think of {topic}?", f"I love {topic}. Do you?"])
    reasoning = f"The user asks about {topic}. Let me work through it."
    return q, reasoning, f"Sure! {topic[0].upper() + topic[1:]} is a fascinating subject."


def _code_turn(rng: random.Random) -> tuple[str, str, str]:
    what, code = rng.choice(_CODE_REQUESTS)
    q = rng.choice([f"Write a Python function that {what}.", f"Can you show me code that {what}?"])
    reasoning = f"The user asks for a function that {what}. Let me work through it."
    return q, reasoning, f"Here is the code:\n{code}"


def _history(rng: random.Random, max_turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, max_turns)):
        q, _r, a = rng.choice([_math_turn, _chat_turn, _code_turn])(rng)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs


def _conversation(rng: random.Random, kind: str) -> dict[str, Any]:
    """One synthetic example of a kind: ``answer`` (reasoning, ``</think>``, answer, ``<|im_end|>``),
    ``tool_call`` (a tool-call section in place of the answer), ``tool_answer`` (tools declared but
    answered directly), ``tool_result`` (the answer after a tool result) or ``ramble`` (no ``</think>``)."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(["You are a helpful assistant.", "Answer briefly."])})
    messages += _history(rng, 2)
    tools = None
    end = "<|im_end|>"
    if kind == "answer":
        q, reasoning, answer = rng.choice([_math_turn, _math_turn, _chat_turn, _code_turn])(rng)
        messages.append({"role": "user", "content": q})
        completion = f"{reasoning}</think>{answer}{end}"
    elif kind in ("tool_call", "tool_answer", "tool_result"):
        names = rng.sample(sorted(_TOOL_SPECS), rng.randint(1, 3))
        tools = [_tool_schema(n) for n in names]
        name = rng.choice(names)
        q, args, desc = _tool_request(rng, name)
        if kind == "tool_answer":
            q, reasoning, answer = rng.choice([_math_turn, _chat_turn])(rng)
            messages.append({"role": "user", "content": q})
            completion = f"{reasoning} No tool is needed.</think>{answer}{end}"
        else:
            messages.append({"role": "user", "content": q})
            reasoning = f"The user wants {desc}. I should call {name}."
            call_id = f"functions.{name}:0"
            section = (
                "<|tool_calls_section_begin|><|tool_call_begin|>"
                f"{call_id}<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
                "<|tool_calls_section_end|>"
            )
            if kind == "tool_call":
                completion = f"{reasoning}</think>{section}{end}"
            else:
                call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                messages.append(
                    {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call]}
                )
                result = rng.choice(["sunny, 21 C", "42", "ok", "3 results found", "12:30"])
                messages.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result})
                completion = f"The tool returned {result}. Let me summarize it.</think>The result is {result}.{end}"
    elif kind == "ramble":
        topic = rng.choice(_PONDER_TOPICS)
        q = rng.choice([f"Ponder {topic} forever.", f"Think very hard about {topic}, without stopping."])
        messages.append({"role": "user", "content": q})
        i = rng.randrange(len(_RAMBLE_LINES))
        lines = [_RAMBLE_LINES[(i + k) % len(_RAMBLE_LINES)] for k in range(rng.randint(8, 12))]
        completion = " ".join([f"The user wants me to ponder {topic}.", *lines])
    else:
        raise ValueError(f"unknown conversation kind {kind!r}")
    return {"messages": messages, "tools": tools, "completion": completion, "kind": kind}


#: Share of each kind in the training mix: ~60 % answers, ~25 % tool calls, ~15 % rambles.
_KIND_WEIGHTS = {"answer": 0.45, "tool_answer": 0.07, "tool_result": 0.08, "tool_call": 0.25, "ramble": 0.15}


def demo_conversations(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` synthetic conversations of the training mix: ``messages``, ``tools`` (None or JSON-schema
    functions), the target ``completion`` text and its ``kind``."""
    rng = random.Random(seed)
    kinds, weights = zip(*_KIND_WEIGHTS.items())
    return [_conversation(rng, rng.choices(kinds, weights)[0]) for _ in range(n)]


def _encode_examples(tok: Any, convs: list[dict[str, Any]]) -> list[Example]:
    out = []
    for conv in convs:
        kwargs = {"tools": conv["tools"]} if conv["tools"] else {}
        prompt = tok.apply_chat_template(
            conv["messages"], add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        completion = tok.encode(conv["completion"], add_special_tokens=False)
        out.append((list(prompt) + completion, len(prompt)))
    return out


def _length_buckets(examples: list[Example], batch_size: int, steps: int, rng: random.Random) -> list[list[Example]]:
    """``steps`` batches of similar-length examples (less padding), in random order."""
    batches: list[list[Example]] = []
    window = batch_size * 4
    while len(batches) < steps:
        order = examples[:]
        rng.shuffle(order)
        epoch = []
        for start in range(0, len(order) - batch_size + 1, window):
            chunk = sorted(order[start : start + window], key=lambda e: len(e[0]))
            epoch += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
        rng.shuffle(epoch)
        batches += epoch
    return batches[:steps]


def _train(model: Any, tok: Any, *, steps: int, seed: int) -> None:
    import torch

    batch_size = 20
    n_negatives = 4096
    examples = _encode_examples(tok, demo_conversations(max(steps * batch_size // 2, 256), seed=seed + 1))
    always = torch.tensor(sorted({t for ids, p in examples for t in ids[p:]}), dtype=torch.long)

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    try:  # the fused CPU kernel is ~10x faster on the 10 M-parameter embedding
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.98), fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / max(steps, 1)))
    weight = model.get_input_embeddings().weight
    model.train()
    t0 = time.monotonic()
    for step, batch in enumerate(_length_buckets(examples, batch_size, steps, rng)):
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for i, (ids, plen) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attn[i, : len(ids)] = 1
            labels[i, plen : len(ids)] = torch.tensor(ids[plen:])
        hidden = model.model(input_ids=input_ids, attention_mask=attn).last_hidden_state
        y = labels[:, 1:]
        keep = y != -100
        h, y = hidden[:, :-1][keep], y[keep]
        negatives = torch.randint(0, model.config.vocab_size, (n_negatives,), generator=gen)
        cand = torch.unique(torch.cat([y, always, negatives]))
        loss = torch.nn.functional.cross_entropy(h @ weight[cand].T, torch.searchsorted(cand, y))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0 or step == steps - 1:
            log.info("step %d/%d loss %.3f (%.1f s)", step + 1, steps, loss.item(), time.monotonic() - t0)
    model.eval()


def _write_demo_model(out_dir: Path, *, steps: int, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    write_kimi_tokenizer(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen3ForCausalLM(cfg)
    if steps > 0:
        _train(model, tok, steps=steps, seed=seed)
    # config.json names the sequence's end [EOS] (as Kimi-K2.5's does); generation_config.json the
    # turn's end, where a chat model's generate() stops. SGLang stops on both.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    model.save_pretrained(out_dir)
    for f in filter(Path.is_file, out_dir.iterdir()):
        os.chmod(f, 0o644)


def build_demo_model_dir(out_dir: Path, *, steps: int = 120, seed: int = 0) -> Path:
    """Write the Kimi-shaped tokenizer and the tiny ``Qwen3ForCausalLM`` (2 layers, hidden 64, tied
    embeddings) trained for ``steps`` CPU steps with a sampled-softmax loss, deterministic for a given
    ``seed``, to ``out_dir``; return it."""
    import torch

    torch.set_num_threads(1)
    return atomic_build(Path(out_dir), lambda d: _write_demo_model(d, steps=steps, seed=seed), "demo model")
