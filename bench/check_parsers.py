"""check_parsers throughput against the bare floor (batch_decode + encode_batch of the same rows).

Rows are synthesized from real text (Python's own documentation strings and sources shipped in this
environment), cut at whitespace into reasoning and answer pieces, each encoded on its own:
`reasoning </think> answer <|im_end|>` with 1k-4k output tokens, and a share of tool-call rows
(`... </think> <tool section> <|im_end|>`). Both measurements run in the same process, alternating,
and the best of the repeats is reported.

    .venv/bin/python bench/check_parsers.py [--rows 2000] [--repeats 3] [--model kimi|qwen3|both]
        [--smoke] [--figures FILE]
"""

import json
import random
import sys
import time
from pathlib import Path

from _harness import ROOT, BenchParser, write_figures

sys.path.insert(0, str(ROOT / "scripts"))

from transformers import AutoTokenizer  # noqa: E402

from eagle3_datagen.demo.tokenizers import build_kimi_shaped_tokenizer, qwen3_tokenizer_dir  # noqa: E402
from eagle3_datagen.settings import ModelProfile  # noqa: E402
from eagle3_datagen.steps import check_parsers as parser_check  # noqa: E402
from eagle3_datagen.tokens.templating import ChatTokenizer  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def real_text(min_chars: int = 3_000_000) -> str:
    """Text of the standard library's modules (docstrings, comments, code): real, varied, offline."""
    import sysconfig

    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        parts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    return "\n".join(parts)


def kimi_tokenizer_path() -> Path:
    import hashlib

    from eagle3_datagen.demo import model, tokenizers

    key = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in (tokenizers, model))).hexdigest()[:16]
    path = ROOT / ".cache" / "fixtures" / key / "kimi_tokenizer"
    if not path.is_dir():
        build_kimi_shaped_tokenizer(path)
    return path


def profiles():
    kimi = kimi_tokenizer_path()
    qwen = qwen3_tokenizer_dir()
    return {
        "kimi": (
            kimi,
            ModelProfile(
                name="kimi",
                tokenizer=str(kimi),
                context_length=65536,
                prompt_suffix=("<think>",),
                reasoning_end="</think>",
                stop_tokens=("<|im_end|>",),
                reasoning_parser="kimi_k2",
                tool_call_parser="kimi_k2",
                sglang_version="0.5.23",
            ),
        ),
        "qwen3": (
            qwen,
            ModelProfile(
                name="qwen3",
                tokenizer=str(qwen),
                context_length=65536,
                reasoning_end="</think>",
                stop_tokens=("<|im_end|>", "<|endoftext|>"),
                reasoning_parser="qwen3",
                tool_call_parser="qwen25",
                sglang_version="0.5.23",
            ),
        ),
    }


def synthesize(tok, profile, n_rows: int, text: str, seed: int = 0, tool_share: float = 0.15):
    rng = random.Random(seed)
    enc = lambda s: tok.backend_tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    tid = tok.convert_tokens_to_ids
    end, stop = tid("</think>"), tid("<|im_end|>")
    chat = ChatTokenizer(tok, profile)
    words = text.split(" ")
    gens = []
    conversations, tools_list = [], []
    for i in range(n_rows):
        conversations.append(
            [{"role": "user", "content": f"Question {i}: " + " ".join(words[rng.randrange(len(words) - 60) :][:40])}]
        )
        tools_list.append(TOOLS if rng.random() < tool_share else None)
    prompt_ids = [t.prompt_ids for t in chat.tokenize(conversations, tools_list)]
    for i in range(n_rows):
        target = rng.randint(1000, 4000)
        n_words = int(target / 1.3)
        start = rng.randrange(len(words) - n_words - 1)
        chunk = words[start : start + n_words]
        cut = int(len(chunk) * rng.uniform(0.5, 0.85))
        qwen = profile.reasoning_parser == "qwen3"
        reasoning = ("\n" if qwen else "") + " ".join(chunk[:cut]).strip() + ("\n" if qwen else "")
        answer = ("\n\n" if qwen else "") + " ".join(chunk[cut:]).strip()
        out = ([tid("<think>")] if qwen else []) + enc(reasoning) + [end]
        if tools_list[i]:
            args = json.dumps({"query": " ".join(chunk[cut : cut + 8])})
            if qwen:
                out += enc(
                    "\n\n<tool_call>\n"
                    + json.dumps({"name": "search_docs", "arguments": json.loads(args)})
                    + "\n</tool_call>"
                )
            else:
                out += [tid("<|tool_calls_section_begin|>"), tid("<|tool_call_begin|>")] + enc(
                    "functions.search_docs:0"
                )
                out += (
                    [tid("<|tool_call_argument_begin|>")]
                    + enc(args)
                    + [tid("<|tool_call_end|>"), tid("<|tool_calls_section_end|>")]
                )
        else:
            out += enc(answer)
        out.append(stop)
        gens.append(
            {
                "id": str(i),
                "sample_index": 0,
                "turn": 0,
                "status": "ok",
                "messages": json.dumps(conversations[i]),
                "tools": json.dumps(tools_list[i]) if tools_list[i] else "",
                "prompt_ids": prompt_ids[i],
                "output_ids": out,
                "finish_type": "stop",
                "finish_matched": str(stop),
            }
        )
    return gens


def floor(tok, gens) -> float:
    t0 = time.perf_counter()
    texts = tok.batch_decode([g["output_ids"] for g in gens], skip_special_tokens=False)
    tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return time.perf_counter() - t0


def check(tok, profile, gens):
    t0 = time.perf_counter()
    rows = parser_check.check_rows(gens, tokenizer=tok, profile=profile)
    return time.perf_counter() - t0, rows


def main() -> int:
    ap = BenchParser(__doc__, smoke={"rows": 20, "repeats": 1})
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=["kimi", "qwen3", "both"], default="both")
    args = ap.parse_args()
    text = real_text()
    models = {}
    for name, (path, profile) in profiles().items():
        if args.model not in (name, "both"):
            continue
        tok = AutoTokenizer.from_pretrained(str(path))
        gens = synthesize(tok, profile, args.rows, text)
        n_tokens = sum(len(g["output_ids"]) for g in gens)
        floors, checks, rows = [], [], None
        for _ in range(args.repeats):
            floors.append(floor(tok, gens))
            seconds, rows = check(tok, profile, gens)
            checks.append(seconds)
        f, c = min(floors), min(checks)
        print(f"{name}: {len(gens)} rows, {n_tokens} output tokens, verdicts {parser_check.counts(rows)}")
        print(f"  floor (batch_decode + encode_batch): {f:.2f} s, {n_tokens / f:,.0f} tokens/s")
        print(f"  check_rows:                          {c:.2f} s, {n_tokens / c:,.0f} tokens/s")
        print(f"  ratio check/floor speed:             {f / c:.2f}x")
        models[name] = {
            "rows": len(gens),
            "output_tokens": n_tokens,
            "floor_s": round(f, 3),
            "check_rows_s": round(c, 3),
            "check_rows_over_floor": round(f / c, 3),
            "verdicts": parser_check.counts(rows),
        }
    write_figures(args, {"rows": args.rows, "repeats": args.repeats, "models": models})
    return 0


if __name__ == "__main__":
    sys.exit(main())
