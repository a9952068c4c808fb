"""The loop detector's labelled corpus, built from real answers on the token ids. Run as a script,
it prints recall per loop class and flags per class of legitimate text (the docs quote them):

    .venv/bin/python tests/quality_corpus.py [--full] [--per-class N] [--tokenizer qwen3|kimi]

- Not loops: the assistant answers of ShareGPT V3's first 1,500 conversations (`--full`: all
  67,594 answers of the file), MT-Bench's reference answers, HumanEval's prompts, and legitimate
  repetition: written here (markdown tables, one with empty rows, lists, code with repeated and
  identical lines, a song with its chorus, ASCII art, a multiplication table) and taken from the
  real answers (`segments`: their markdown tables, lists, code blocks and lines said three times).
  Each is judged as a finished answer and also cut where a budget could have cut it (`at_budget`):
  a real answer at a random point, a segment right at its end.
- Loops (`loops`): a real answer (several, where the onset lies past one) cut at an onset, then its
  last `period` tokens repeated until the budget, each token swapped for another token of the
  answer with probability `rate` (a loop that wobbles, as at temperature 1.0). Onsets are `early`
  (anywhere from the period to where the loop still has room for its evidence), `late` (the last
  10 % of the budget, with that room: at least 16 copies of a short n-gram) or `late_any` (the last
  10 %, room or not: what no detector can always see).
"""

import json
import math
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT / ".cache" / "realdata"
PERIODS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 200, 256)
BUDGETS = (2048, 4096, 32768)
RATES = (0.0, 0.02, 0.05, 0.1, 0.2)
ONSETS = ("early", "late", "late_any")

TABLE = "| Model | Params | MMLU | GSM8K |\n|---|---|---|---|\n" + "".join(
    f"| model-{i} | {7 * i}B | {50 + i * 0.7:.1f} | {40 + i * 1.3:.1f} |\n" for i in range(1, 60)
)
EMPTY_TABLE = "| a | b | c | d | e |\n|---|---|---|---|---|\n" + "|   |   |   |   |   |\n" * 8
NUMBERED = "".join(f"{i}. Step {i}: add the next item to the list.\n" for i in range(1, 120))
BULLETS = "".join(f"- Item {chr(65 + i % 26)}{i}: done\n" for i in range(150))
CODE = (
    "def setup(board):\n"
    + "".join(f"    board[{i}][{j}] = 0\n" for i in range(12) for j in range(8))
    + "    return board\n"
)
CODE_SAME_LINES = "x = []\n" + "x.append(0)\n" * 12 + "print(x)\n"
CHORUS = "And we sing la la la, under the open sky, la la la, and the night goes by.\n"
SONG = "".join(
    f"Verse {v}: the road was long and the town was far, number {v} of many.\n" + CHORUS * 2 for v in range(1, 6)
)
ASCII_ART = (
    "+" + "-" * 78 + "+\n" + "|" + " " * 78 + "|\n" * 3 + "|" + "HELLO".center(78) + "|\n" + "+" + "-" * 78 + "+\n"
) * 3
MULTIPLICATION = "".join(f"{a} x {b} = {a * b}\n" for a in range(1, 13) for b in range(1, 13))
WRITTEN = {
    "markdown table": TABLE,
    "empty markdown table": EMPTY_TABLE,
    "numbered list": NUMBERED,
    "bulleted list": BULLETS,
    "code with repeated lines": CODE,
    "code with identical lines": CODE_SAME_LINES,
    "song with chorus": SONG,
    "ascii art": ASCII_ART,
    "multiplication table": MULTIPLICATION,
}


def sharegpt_answers(full: bool = False, conversations: int = 1500) -> list[str]:
    """Assistant answers of ShareGPT V3: its first `conversations` (read without parsing the whole
    125 MB file), or with `full` every one of them."""
    path = REALDATA / "sharegpt.json"
    if full:
        convs = json.loads(path.read_text())
    else:
        decoder, convs = json.JSONDecoder(), []
        with open(path, encoding="utf-8") as fh:
            buf, pos = fh.read(1), 1  # past the opening bracket
            while len(convs) < conversations:
                chunk = fh.read(1 << 20)
                buf = buf[pos:] + chunk
                pos = 0
                while len(convs) < conversations:
                    while pos < len(buf) and buf[pos] in ", \n\r\t":
                        pos += 1
                    try:
                        conv, pos = decoder.raw_decode(buf, pos)
                    except json.JSONDecodeError:
                        break
                    convs.append(conv)
                if not chunk:
                    break
    return [t["value"] for c in convs for t in c.get("conversations") or () if t.get("from") == "gpt" and t["value"]]


def other_answers() -> list[str]:
    out = []
    for line in (REALDATA / "mtbench.jsonl").read_text().splitlines():
        for m in json.loads(line).get("messages") or ():
            if m.get("role") == "assistant" and m.get("content"):
                out.append(m["content"])
    for line in (REALDATA / "humaneval.jsonl").read_text().splitlines():
        for m in json.loads(line).get("messages") or ():
            out.append(m["content"])
    return out


def not_loops(full: bool = False) -> dict[str, list[str]]:
    """Texts that are not loops, by source."""
    return {
        "sharegpt": sharegpt_answers(full),
        "mt-bench and humaneval": other_answers(),
        **{k: [v] for k, v in WRITTEN.items()},
    }


def segments(answers: list[str]) -> dict[str, list[str]]:
    """Legitimate repetition in real answers, by kind: each answer up to the end of its first markdown
    table (3+ lines starting with `|`), list (5+ items), code block (5+ lines) or line said 3+ times."""
    patterns = {
        "real tables": re.compile(r"(?:^[ \t]*\|.*\n){3,}", re.M),
        "real lists": re.compile(r"(?:^[ \t]*(?:\d+[.)]|[-*+])[ \t].*\n){5,}", re.M),
        "real code blocks": re.compile(r"^```.*\n(?:(?!```).*\n){5,}?```", re.M),
    }
    out: dict[str, list[str]] = {k: [] for k in [*patterns, "real repeated lines"]}
    for text in answers:
        for kind, pattern in patterns.items():
            found = pattern.search(text)
            if found:
                out[kind].append(text[: found.end()])
        lines = [line for line in text.splitlines() if len(line.strip()) > 3]
        repeated = {line for line in lines if lines.count(line) >= 3}
        if repeated:
            out["real repeated lines"].append(text[: text.rindex(max(repeated, key=len)) + len(max(repeated, key=len))])
    return out


def room(period: int, rate: float, settings) -> int:
    """Tokens a loop of this period needs before the budget for its evidence to be there: what
    `find_loop` must see at the budget, a quarter more where its tokens wobble."""
    return math.ceil(settings.need(period, at_budget=True) * (1.25 if rate else 1.0))


def loops(encoded: list[list[int]], settings, *, per_class: int = 1, seed: int = 0, budgets=BUDGETS) -> list[dict]:
    """Looping outputs of every budget, onset class, period and rate (`per_class` of each), made from
    the real answers `encoded` (token ids); each records how it was made."""
    rng = random.Random(seed)
    long = [ids for ids in encoded if len(ids) > 300]
    out = []
    for budget in budgets:
        for onset_kind in ONSETS:
            for period in PERIODS:
                for rate in RATES:
                    lo, hi = _onset_range(onset_kind, budget, period, rate, settings)
                    if lo > hi:
                        continue  # this period has no room for its evidence in the last 10 %
                    for _ in range(per_class):
                        onset = rng.randint(lo, hi)
                        ids = _looped(rng, long, budget, period, onset, rate)
                        out.append(
                            {"ids": ids, "budget": budget, "onset_kind": onset_kind, "period": period}
                            | {"onset": onset, "rate": rate}
                        )
    return out


def _onset_range(kind: str, budget: int, period: int, rate: float, settings) -> tuple[int, int]:
    late = budget - budget // 10
    if kind == "early":
        return period, budget - room(period, rate, settings)
    if kind == "late":
        return late, budget - room(period, rate, settings)
    return late, budget - 1


def _looped(rng: random.Random, answers: list[list[int]], budget: int, period: int, onset: int, rate: float) -> list:
    """Real answers written one after another up to `onset`, then their last `period` tokens looped to
    the budget, each token swapped for another of the answer's tokens with probability `rate`."""
    head: list[int] = []
    while len(head) < onset:
        head += rng.choice(answers)
    head = head[:onset]
    gram = head[-period:]
    body = (gram * ((budget - onset) // period + 1))[: budget - onset]
    pool = sorted(set(head[-2000:]))
    body = [rng.choice(pool) if rng.random() < rate else t for t in body]
    return head + body


def live_stop_at(ids: list[int], settings, interval: int = 32) -> int | None:
    """Where a `LiveLoopWatch` fed `ids` in chunks of `interval` would stop the output, or None."""
    from eagle3_datagen.quality.loops import LiveLoopWatch

    watch = LiveLoopWatch(settings)
    for i in range(0, len(ids), interval):
        if watch.feed(ids[i : i + interval]) is not None:
            return min(i + interval, len(ids))
    return None


def legitimate(tokenizer, texts: dict[str, list[str]], seed: int = 0) -> dict[str, list[tuple[list[int], bool]]]:
    """Per class of legitimate text: (ids, at_budget) to judge. Every text as a finished answer; cut by
    a budget, a real answer at a random point past its first 64 tokens, a segment at its end."""
    rng = random.Random(seed)
    out = {}
    for source, items in texts.items():
        encoded = [tokenizer.encode(t, add_special_tokens=False) for t in items]
        out[source] = [(ids, False) for ids in encoded]
        if source.startswith("real ") or source not in ("sharegpt", "mt-bench and humaneval"):
            out[f"{source}, cut at its end by a budget"] = [(ids, True) for ids in encoded]
        else:
            cut = [ids[: rng.randint(64, len(ids))] for ids in encoded if len(ids) > 64]
            out[f"{source}, cut at a random point by a budget"] = [(ids, True) for ids in cut]
    return out


def rates(tokenizer, settings, *, full: bool = False, per_class: int = 1, live: bool = True) -> dict:
    """The detector on the corpus: recall per loop class (flag, and live stop where the loop has room
    for the live threshold before its budget), flags per class of legitimate text, with examples."""
    from eagle3_datagen.quality.loops import find_loop

    texts = not_loops(full)
    texts |= segments(texts["sharegpt"])
    report: dict = {"legitimate": {}, "loops": {}}
    for source, items in legitimate(tokenizer, texts).items():
        flagged = [i for i, (ids, cut) in enumerate(items) if find_loop(ids, settings, at_budget=cut)]
        stopped = [i for i, (ids, _) in enumerate(items) if live and live_stop_at(ids, settings) is not None]
        report["legitimate"][source] = {"rows": len(items), "flagged": flagged[:20], "stopped_live": stopped[:20]}
    encoded = [tokenizer.encode(t, add_special_tokens=False) for t in texts["sharegpt"][:400]]
    live_need = settings.live().need
    for item in loops(encoded, settings, per_class=per_class):
        key = f"{item['onset_kind']} onset, {item['rate']:.0%} swapped"
        cls = report["loops"].setdefault(key, {"loops": 0, "flagged": 0, "live": 0, "stopped_live": 0, "missed": []})
        cls["loops"] += 1
        found = find_loop(item["ids"], settings, at_budget=True)
        cls["flagged"] += found is not None
        if found is None and len(cls["missed"]) < 5:
            cls["missed"].append({k: item[k] for k in ("budget", "period", "onset", "rate")})
        if live and item["budget"] - item["onset"] >= 2 * live_need(item["period"]):
            cls["live"] += 1
            cls["stopped_live"] += live_stop_at(item["ids"], settings) is not None
    return report


def tokenizer_named(name: str):
    """The corpus's tokenizers: the real Qwen3 one, or Kimi-K2.5's TikToken format (the tests' fixture)."""
    from transformers import AutoTokenizer

    if name == "qwen3":
        from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir

        return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    from conftest import cached_build  # the fixture as the tests build it
    from eagle3_datagen.demo.tokenizers import build_kimi_tiktoken_tokenizer

    folder = cached_build("kimi_tiktoken", build_kimi_tiktoken_tokenizer)
    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)


if __name__ == "__main__":
    import argparse

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "tests"))
    from eagle3_datagen.quality.loops import LoopSettings

    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--per-class", type=int, default=2)
    parser.add_argument("--tokenizer", default="qwen3", choices=["qwen3", "kimi"])
    parser.add_argument("--no-live", action="store_true")
    args = parser.parse_args()
    tok = tokenizer_named(args.tokenizer)
    out = rates(tok, LoopSettings(), full=args.full, per_class=args.per_class, live=not args.no_live)
    print(json.dumps(out, indent=1, default=str))
