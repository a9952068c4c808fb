"""Prompt tokenization throughput against the bare floor (Jinja rendering + batch encoding of the same prompts).

Three tokenizers: the real Qwen3 one and the Kimi-shaped one (fast, tokenizer.json), and the
TikToken one in the format of Kimi-K2.5's real tokenizer (slow remote code over tiktoken.Encoding;
its floor encodes with the Encoding's own `encode_batch`).

Conversations are built from the demo prompt files (config/prompts/*.jsonl, read with read_prompts as
the pipeline does), repeated and varied (a numbered prefix and a sentence of another row added to the
last user message), keeping each row's tools: --rows of them, about 12 % with tools, and the code
rows' literal control text (`<think>` typed by a user) where the demo has it. Timed in the same run,
alternating, median of the repeats:

  floor          apply_chat_template(conversations, tools=..., tokenize=False) per group of identical
                 tools (the groups made before the clock starts), then backend_tokenizer.encode_batch
                 of the rendered strings: rendering and tokenizing, nothing else;
  ChatTokenizer  ChatTokenizer(tokenizer, profile).tokenize(conversations, tools_list): what rule
                 tokenize_prompts runs (grouping, literal control text, rendering, encoding); "warm"
                 reuses one ChatTokenizer (the per-prompt cost), "cold" makes a new one per run as each
                 tokenize_prompts job does (adding its one-off set-up, mostly the text-only encoder
                 built at the first row with literal control text);
  build_prompt_rows  the whole table step of that rule around it, cold (budgets, seeds, hashes, JSON);
  naive loop     apply_chat_template(conversation, tools=..., tokenize=True) row by row.

The goal is ChatTokenizer at >= 0.9x the floor's prompts/s. The ids of ChatTokenizer and the naive
loop are compared on every row without literal control text (where they must agree).

    .venv/bin/python bench/tokenization.py [--rows 5000] [--repeats 3] [--model kimi|qwen3|tiktoken|all]
"""

import hashlib
import random
import statistics
import sys
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.demo import model as demo_model  # noqa: E402
from eagle3_datagen.demo import tokenizers as fixtures  # noqa: E402
from eagle3_datagen.settings import Budget, ModelProfile  # noqa: E402
from eagle3_datagen.steps.tokenize_prompts import build_prompt_rows  # noqa: E402
from eagle3_datagen.storage.prompt_rows import PromptRow  # noqa: E402
from eagle3_datagen.storage.prompts import read_prompts  # noqa: E402
from eagle3_datagen.tokens.encoding import TextOnlyEncoder  # noqa: E402
from eagle3_datagen.tokens.templating import ChatTokenizer, group_by_tools  # noqa: E402
from eagle3_datagen.tokens.vocabulary import tiktoken_model  # noqa: E402


def fixture_path(name: str, build) -> Path:
    key = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (fixtures, demo_model))).hexdigest()[:16]
    path = ROOT / ".cache" / "fixtures" / key / name
    if not path.is_dir():
        build(path)
    return path


def profiles() -> dict:
    kimi, qwen = fixture_path("kimi_tokenizer", fixtures.build_kimi_shaped_tokenizer), fixtures.qwen3_tokenizer_dir()
    tiktoken_dir = fixture_path("kimi_tiktoken", fixtures.build_kimi_tiktoken_tokenizer)
    kimi_like = dict(
        context_length=131072,
        chat_template_kwargs={"thinking": True},
        prompt_suffix=("<think>",),
        reasoning_end="</think>",
        stop_tokens=("<|im_end|>",),
        prompt_only_tokens=("<think>",),
    )
    return {
        "tiktoken": ModelProfile(
            name="kimi-tiktoken", tokenizer=str(tiktoken_dir), trust_remote_code=True, **kimi_like
        ),
        "kimi": ModelProfile(name="kimi", tokenizer=str(kimi), **kimi_like),
        "qwen3": ModelProfile(
            name="qwen3",
            tokenizer=str(qwen),
            context_length=40960,
            chat_template_kwargs={"enable_thinking": True},
            reasoning_end="</think>",
            stop_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
    }


def conversations(n: int, seed: int = 0) -> list[PromptRow]:
    """`n` rows made from the demo prompt files, each one's last user message varied."""
    demo = [r for path in sorted((ROOT / "config" / "prompts").glob("*.jsonl")) for r in read_prompts(path) if r.ok]
    texts = [m["content"] for r in demo for m in r.messages if m["role"] == "user"]
    sentences = [s.strip() + "." for t in texts for s in t.split(". ") if len(s) > 20]
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        src = demo[i % len(demo)]
        messages = [dict(m) for m in src.messages]
        last = max(k for k, m in enumerate(messages) if m["role"] == "user")
        messages[last]["content"] = f"({i}) {messages[last]['content']} {rng.choice(sentences)}"
        rows.append(PromptRow(id=f"{src.id}-{i}", source=f"bench:{i}", messages=messages, tools=src.tools))
    return rows


def floor(tok, profile: ModelProfile, groups: list[tuple[list, list]]) -> float:
    t0 = time.perf_counter()
    for convs, tools in groups:
        texts = tok.apply_chat_template(
            convs, tools=tools, add_generation_prompt=True, tokenize=False, **profile.chat_template_kwargs
        )
        if getattr(tok, "backend_tokenizer", None) is not None:
            tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
        else:  # TikToken: its Encoding's own batch encoding, special-token text matched as the tokenizer does
            tiktoken_model(tok).encode_batch(texts, allowed_special="all")
    return time.perf_counter() - t0


def pipeline(
    tok, profile: ModelProfile, rows: list[PromptRow], chat: ChatTokenizer | None = None
) -> tuple[float, list]:
    chat = chat or ChatTokenizer(tok, profile)
    t0 = time.perf_counter()
    out = chat.tokenize([r.messages for r in rows], [r.tools for r in rows])
    return time.perf_counter() - t0, out


def table_step(tok, profile: ModelProfile, rows: list[PromptRow]) -> float:
    t0 = time.perf_counter()
    chat = ChatTokenizer(tok, profile)
    build_prompt_rows(
        rows,
        chat,
        profile=profile,
        budget=Budget(max_new_tokens=32768, min_new_tokens=256, reserve_tokens=2),
        category="bench",
    )
    return time.perf_counter() - t0


def naive(tok, profile: ModelProfile, rows: list[PromptRow]) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = [
        tok.apply_chat_template(
            r.messages,
            tools=r.tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **profile.chat_template_kwargs,
        )
        for r in rows
    ]
    return time.perf_counter() - t0, out


def main() -> int:
    ap = BenchParser(__doc__, smoke={"rows": 40, "repeats": 1})
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=["kimi", "qwen3", "tiktoken", "all"], default="all")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    rows = conversations(args.rows)
    n_tools = sum(bool(r.tools) for r in rows)
    print(
        f"{len(rows)} conversations from the demo prompt files, {n_tools} ({n_tools / len(rows):.0%}) with tools; median of {args.repeats}"
    )
    print(
        f"{'tokenizer':10}{'prompt tok':>11}{'step':>21}{'seconds':>9}{'(min-max)':>13}{'prompts/s':>11}{'vs floor':>10}"
    )
    models = {}
    for name, profile in profiles().items():
        if args.model not in (name, "all"):
            continue
        tok = AutoTokenizer.from_pretrained(profile.tokenizer, trust_remote_code=profile.trust_remote_code)
        groups = [
            ([rows[i].messages for i in idx], rows[idx[0]].tools)
            for idx in group_by_tools([r.tools for r in rows]).values()
        ]
        times: dict[str, list[float]] = {
            "floor": [],
            "ChatTokenizer warm": [],
            "ChatTokenizer cold": [],
            "build_prompt_rows": [],
            "naive loop": [],
        }
        warm = ChatTokenizer(tok, profile)
        pipeline(tok, profile, rows[:200], warm)  # warm-up: template compilation, caches, the text-only encoder
        text_only = []
        for _ in range(args.repeats):
            times["floor"].append(floor(tok, profile, groups))
            seconds, ours = pipeline(tok, profile, rows, warm)
            times["ChatTokenizer warm"].append(seconds)
            times["ChatTokenizer cold"].append(pipeline(tok, profile, rows)[0])
            times["build_prompt_rows"].append(table_step(tok, profile, rows))
            t0 = time.perf_counter()
            TextOnlyEncoder(tok)
            text_only.append(time.perf_counter() - t0)
            seconds, reference = naive(tok, profile, rows)
            times["naive loop"].append(seconds)
        literal = sum(t.has_literal_control_text for t in ours)
        mismatched = sum(t.prompt_ids != list(ref) for t, ref in zip(ours, reference) if not t.has_literal_control_text)
        n_tokens = sum(len(t.prompt_ids) for t in ours)
        base = statistics.median(times["floor"])
        for step, ts in times.items():
            s = statistics.median(ts)
            print(
                f"{name if step == 'floor' else '':10}{n_tokens if step == 'floor' else '':>11}{step:>21}{s:>9.2f}{f'({min(ts):.2f}-{max(ts):.2f})':>13}{len(rows) / s:>11.0f}{base / s:>9.2f}x"
            )
        print(
            f"{'':10}one-off: TextOnlyEncoder(tokenizer) {statistics.median(text_only):.2f} s, built by a ChatTokenizer at its first row with literal control text"
        )
        models[name] = {
            "prompt_tokens": n_tokens,
            "floor_prompts_per_s": round(len(rows) / base, 1),
            "over_floor": {step: round(base / statistics.median(ts), 3) for step, ts in times.items()},
            "ids_differing": mismatched,
        }
        print(
            f"{'':10}ids: {mismatched} of {len(rows) - literal} rows differ from the naive loop ({literal} rows hold literal control text, encoded as text by ChatTokenizer)"
        )
    print(
        "goal: ChatTokenizer >= 0.9x the floor. warm: one ChatTokenizer reused (the per-prompt cost); cold: a new one,"
    )
    print(
        "as each tokenize_prompts job makes (per-prompt cost plus one-off set-up); build_prompt_rows: cold, the whole table step"
    )
    write_figures(args, {"rows": len(rows), "repeats": args.repeats, "models": models})
    return 0


if __name__ == "__main__":
    sys.exit(main())
