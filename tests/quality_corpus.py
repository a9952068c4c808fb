"""The loop detector's test corpus: real answers and written repetition that are not loops, and
loops of many periods and onsets made from real text. Run as a script, it prints the detector's
false-positive and false-negative rates on it (the README quotes them):

    .venv/bin/python tests/quality_corpus.py [--full]

- Not loops: the assistant answers of ShareGPT V3's first 1,500 conversations (`--full`: all
  67,594 answers of the file), MT-Bench's reference answers, HumanEval's prompts, and
  legitimate repetition written here: markdown tables, numbered and bulleted lists, code with
  repeated lines, a song with its chorus, ASCII art, a multiplication table.
- Loops: a real answer cut at an onset and continued by one n-gram repeated until the budget, in two
  ways: the last `period` tokens written repeat token for token (a model that fell into a loop), or
  a sentence of the answer is repeated as text and the whole is tokenized again (so the loop's first
  copy may tokenize differently at its seams, as text repeated in a real output does).
"""

import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REALDATA = ROOT / ".cache" / "realdata"
PERIODS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 200, 256)

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


def loops(tokenizer, answers: list[str], n: int, budget: int = 2048, seed: int = 0) -> list[dict]:
    """`n` looping outputs: each a real answer up to an onset, then one n-gram until `budget` tokens."""
    rng = random.Random(seed)
    long_answers = [a for a in answers if len(a) > 400]
    out = []
    while len(out) < n:
        text = rng.choice(long_answers)
        ids = tokenizer.encode(text, add_special_tokens=False)
        period = rng.choice(PERIODS)
        if len(ids) <= period + 1:
            continue
        onset = rng.randint(period, min(len(ids), budget // 2))
        if len(out) % 2 == 0:  # the last `period` tokens written repeat, token for token
            gram = ids[onset - period : onset]
            looped = ids[:onset] + gram * ((budget - onset) // period + 1)
            kind = "token n-gram"
        else:  # a stretch of the text repeats as text, then the whole is tokenized
            head, piece = tokenizer.decode(ids[: onset - period]), tokenizer.decode(ids[onset - period : onset])
            copies = 2 * budget // period + 8
            looped = tokenizer.encode(head + piece * copies, add_special_tokens=False)
            while len(looped) < budget + 2 * period:  # pieces that merge into longer tokens
                copies *= 4
                looped = tokenizer.encode(head + piece * copies, add_special_tokens=False)
            kind = "text repeated"
        out.append({"ids": looped[:budget], "period": period, "onset": onset, "kind": kind})
    return out


def live_stop_at(ids: list[int], settings, interval: int = 32) -> int | None:
    """Where a `LiveLoopWatch` fed `ids` in chunks of `interval` would stop the output, or None."""
    from eagle3_datagen.quality.loops import LiveLoopWatch

    watch = LiveLoopWatch(settings)
    for i in range(0, len(ids), interval):
        if watch.feed(ids[i : i + interval]) is not None:
            return min(i + interval, len(ids))
    return None


def rates(tokenizer, settings, full: bool = False, n_loops: int = 600) -> dict:
    """The detector on the corpus: flags on finished outputs, and where the live stop would stop."""
    from eagle3_datagen.quality.loops import find_loop

    texts = not_loops(full)
    false_positives, live_false_positives = {}, {}
    n_texts = 0
    for source, items in texts.items():
        ids_list = [tokenizer.encode(t, add_special_tokens=False) for t in items]
        n_texts += len(ids_list)
        false_positives[source] = [i for i, ids in enumerate(ids_list) if find_loop(ids, settings) is not None]
        live_false_positives[source] = [i for i, ids in enumerate(ids_list) if live_stop_at(ids, settings) is not None]
    looped = loops(tokenizer, texts["sharegpt"], n_loops)
    missed = [item for item in looped if find_loop(item["ids"], settings) is None]
    stops = [(item, live_stop_at(item["ids"], settings)) for item in looped]
    live_missed = [item for item, at in stops if at is None]
    late = [at - item["onset"] for item, at in stops if at is not None]
    n_fp = sum(len(v) for v in false_positives.values())
    n_live_fp = sum(len(v) for v in live_false_positives.values())
    return {
        "texts": n_texts,
        "false_positives": n_fp,
        "false_positive_rate": n_fp / n_texts,
        "false_positive_examples": {k: v[:3] for k, v in false_positives.items() if v},
        "live_false_positives": n_live_fp,
        "live_false_positive_examples": {k: v[:3] for k, v in live_false_positives.items() if v},
        "loops": len(looped),
        "missed": len(missed),
        "false_negative_rate": len(missed) / len(looped),
        "missed_examples": [{k: m[k] for k in ("period", "onset", "kind")} for m in missed[:5]],
        "live_missed": len(live_missed),
        "live_tokens_after_onset": {"mean": sum(late) / len(late), "max": max(late)} if late else None,
    }


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))
    from transformers import AutoTokenizer

    from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir
    from eagle3_datagen.quality.loops import LoopSettings

    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))
    print(json.dumps(rates(tok, LoopSettings(), full="--full" in sys.argv), indent=1, default=str))
