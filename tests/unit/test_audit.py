"""Audit: a trainer dataset made elsewhere, judged row by row from its ids, without any server.

Rows are built as speculators' `prepare_data` builds them (the chat template rendered with and without
the generation prompt, the loss from the boundary on, cut at its sequence length) on the real Qwen3
tokenizer, and as this pipeline exports them (`export_dataset.dataset_row`) on Kimi-K2.5's TikToken
format; each broken row carries its code on its own line, and clean rows carry none."""

import json
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from eagle3_datagen.quality.audit import AUDIT_CODES, audit_row, loss_spans
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.steps.audit import audit, audit_settings, main
from eagle3_datagen.storage.trainer_rows import dataset_row
from eagle3_datagen.tokens.vocabulary import load_tokenizer

# Short loops, so that the rows stay small: 32 tokens, 4 copies of an n-gram of up to 16 tokens.
REPO = Path(__file__).resolve().parents[2]
LOOP = {"min_tokens": 32, "min_repeats": 4, "max_period": 16}


def write_jsonl(path, lines):
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines))
    return path


def codes_by_line(out):
    records = [json.loads(line) for line in (out / "flags.jsonl").read_text().splitlines()]
    return {r["line"]: sorted({f["code"] for f in r["flags"]}) for r in records}, records


def test_loss_spans_are_the_maximal_runs_of_ones():
    import numpy as np

    assert loss_spans(np.array([0, 1, 1, 0, 0, 1, 0, 1])) == [(1, 3), (5, 6), (7, 8)]
    assert loss_spans(np.array([1, 1])) == [(0, 2)]
    assert loss_spans(np.array([0, 0])) == []


# --- speculators' rows on the Qwen3 tokenizer ---


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    model = defaults(
        "model",
        name="qwen3",
        tokenizer=str(qwen3_tokenizer_dir),
        context_length=4096,
        stop_tokens=["<|im_end|>"],
        reasoning_end="</think>",
    )
    return model, load_tokenizer(ModelProfile.from_config(model))


def speculators_row(tok, messages, seq_length=None):
    """A row as speculators' `_build_boundary_rows` and `_append_row` make it: the last assistant turn
    under the loss from the generation prompt's boundary on, cut at `seq_length`, with `seq_len`."""
    prompt = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
    full = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=True)
    prompt, full = list(getattr(prompt, "input_ids", prompt)), list(getattr(full, "input_ids", full))
    assert full[: len(prompt)] == prompt
    ids, mask = full, [0] * len(prompt) + [1] * (len(full) - len(prompt))
    if seq_length is not None:
        ids, mask = ids[:seq_length], mask[:seq_length]
    return {"input_ids": ids, "loss_mask": mask, "seq_len": len(ids)}


def chat(answer, reasoning="Two and two make four.", question="What is 2 + 2?"):
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer, "reasoning_content": reasoning},
    ]


def test_speculators_rows_are_flagged_with_their_code_and_line(tmp_path, qwen3):
    model, tok = qwen3
    clean = speculators_row(tok, chat("The answer is 4."))
    later_turn = speculators_row(
        tok, chat("Yes.") + [{"role": "user", "content": "And 3 + 3?"}] + chat("It is 6.")[1:]
    )  # the history's answer is prompt, only the last answer is trained
    looping = speculators_row(tok, chat(" ".join(["again and"] * 40)))
    empty = speculators_row(tok, chat(""))
    long_reasoning = chat("4", reasoning=" ".join(f"Step {i}: add one more." for i in range(20)))
    cut = speculators_row(tok, long_reasoning, seq_length=len(speculators_row(tok, long_reasoning)["input_ids"]) - 30)
    odd_id = dict(clean, input_ids=[151_700] + clean["input_ids"][1:])  # inside Qwen3's 151,936 embedding rows
    short_mask = dict(clean, loss_mask=clean["loss_mask"][:-2])
    rows = [clean, later_turn, looping, empty, cut, odd_id, short_mask]
    data = write_jsonl(tmp_path / "speculators.jsonl", rows)

    settings, _ = audit_settings(model, {"loop": LOOP})
    summary = audit(data=data, out=tmp_path / "audit", settings=settings)
    codes, records = codes_by_line(tmp_path / "audit")
    assert codes == {
        1: [],
        2: [],
        3: ["repetition_loop"],
        4: ["empty_answer"],
        5: ["span_without_stop", "unfinished_reasoning"],
        6: ["id_out_of_vocab"],
        7: ["mask_length_mismatch"],
    }
    assert all(r["id"] is None for r in records)  # speculators' rows carry no id
    assert summary["rows"] == 7 and summary["clean_rows"] == 2

    # The model's embedding is larger than the tokenizer: ids below it are inside the vocabulary.
    wide, _ = audit_settings(model, {"loop": LOOP}, vocab_size=151_936)
    assert audit_row(odd_id, wide) == []


# --- this pipeline's own export on Kimi-K2.5's TikToken format ---


@pytest.fixture(scope="module")
def kimi(kimi_tiktoken_dir):
    model = defaults(
        "model",
        name="kimi",
        tokenizer=str(kimi_tiktoken_dir),
        trust_remote_code=True,
        context_length=4096,
        prompt_suffix=["<think>"],
        reasoning_end="</think>",
        stop_tokens=["<|im_end|>"],
    )
    return model, load_tokenizer(ModelProfile.from_config(model))


def kimi_rows(tok):
    """(trainer rows as export_dataset writes them, the codes each must get), the prompt opening the reasoning."""
    ids = tok.convert_tokens_to_ids
    think, end, im_end, eos = ids("<think>"), ids("</think>"), ids("<|im_end|>"), ids("[EOS]")

    def text(s):
        return tok.encode(s, add_special_tokens=False)

    prompt = text("user: what is 2 + 2?") + [think]
    reasoning = text("Two and two make four.")
    outputs = [
        (reasoning + [end] + text("The answer is 4.") + [im_end], "stop", []),
        (reasoning + [end] + text(" again and") * 30, "length", ["repetition_loop", "span_without_stop"]),
        (reasoning + text(" Let me check once more"), "length", ["span_without_stop", "unfinished_reasoning"]),
        (reasoning + [end] + text("\n\n") + [im_end], "stop", ["empty_answer"]),
        (reasoning + [end] + text("4") + [eos], "stop", ["unexpected_stop"]),
    ]
    rows, expected = [], []
    for i, (output, finish, codes) in enumerate(outputs):
        gen = {
            "id": f"q{i}",
            "sample_index": 0,
            "turn": 0,
            "category": "c",
            "prompt_ids": prompt,
            "output_ids": output,
            "finish_type": finish,
            "seed": 1,
        }
        rows.append(dataset_row(gen))
        expected.append(codes)
    clean = rows[0]
    rows.append(dict(clean, id="oov", input_ids=clean["input_ids"][:-3] + [len(tok) + 5] + clean["input_ids"][-2:]))
    expected.append(["id_out_of_vocab"])
    rows.append(dict(clean, id="mask", loss_mask=clean["loss_mask"][:-1]))
    expected.append(["mask_length_mismatch"])
    return rows, expected


def test_our_export_and_broken_lines_are_flagged_and_the_rest_still_audited(tmp_path, kimi):
    model, tok = kimi
    rows, expected = kimi_rows(tok)
    broken = [
        b'{"input_ids": [1, 2',
        b"",
        b'{"loss_mask": [0, 1]}',
        b'{"input_ids": [1, 2], "loss_mask": [0, 2]}',
        b'{"input_ids": [1, 2], "loss_mask": [0, 0]}',
        b'{"input_ids": [1, 2]}',
    ]
    data = write_jsonl(tmp_path / "c.jsonl", broken + rows)
    settings, against = audit_settings(model, {"loop": LOOP})
    summary = audit(data=data, out=tmp_path / "audit", settings=settings, against=against)
    codes, records = codes_by_line(tmp_path / "audit")

    assert codes.pop(1) == ["unreadable_row"] and codes.pop(3) == ["unreadable_row"]
    assert codes.pop(4) == ["mask_not_binary"]
    assert codes.pop(5) == ["no_loss_tokens"] and codes.pop(6) == ["missing_loss_mask"]
    assert 2 not in codes  # a blank line is no row
    assert codes == {7 + k: sorted(c) for k, c in enumerate(expected)}
    assert [r["id"] for r in records[5:]] == [r["id"] for r in rows]
    # Each record names its row as our export does: id, sample, turn and serving mode.
    assert [(r["sample_index"], r["turn"], r["mode"]) for r in records[5:]] == [
        (r["sample_index"], r["turn"], r["mode"]) for r in rows
    ]
    assert "not JSON" in records[0]["flags"][0]["detail"]

    # reasons.tsv counts the rows of each code in flags.jsonl, over every row read.
    table = [line.split("\t") for line in (tmp_path / "audit" / "reasons.tsv").read_text().splitlines()]
    assert table[0] == ["code", "rows", "share"] and [r[0] for r in table[1:]] == list(AUDIT_CODES)
    for code, n, share in table[1:]:
        flagged = sum(code in c for c in codes_by_line(tmp_path / "audit")[0].values())
        assert int(n) == flagged and float(share) == pytest.approx(flagged / summary["rows"], abs=1e-6)
    assert summary["rows"] == len(rows) + 5 and summary["clean_rows"] == 1
    assert (tmp_path / "audit" / "reasons.png").stat().st_size > 0

    # The Parquet dataset of the same rows gets the same flags, row by row.
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    audit(data=tmp_path / "c.parquet", out=tmp_path / "audit_parquet", settings=settings)
    assert codes_by_line(tmp_path / "audit_parquet")[0] == {1 + k: sorted(c) for k, c in enumerate(expected)}


def test_the_command_takes_the_profile_and_loop_from_a_config(tmp_path, kimi, kimi_tiktoken_dir):
    _, tok = kimi
    rows, expected = kimi_rows(tok)
    config = yaml.safe_load((REPO / "config" / "kimi-k2.5.yaml").read_text())
    config["quality"] = {"loop": LOOP}
    (tmp_path / "kimi.yaml").write_text(yaml.safe_dump(config))
    data = write_jsonl(tmp_path / "c.jsonl", rows)
    args = ["--data", str(data), "--config", str(tmp_path / "kimi.yaml"), "--tokenizer", str(kimi_tiktoken_dir)]
    summary = main(args + ["--out", str(tmp_path / "a")])
    assert codes_by_line(tmp_path / "a")[0] == {1 + k: sorted(c) for k, c in enumerate(expected)}
    assert summary["against"]["tokenizer"] == str(kimi_tiktoken_dir)
    # [EOS], the tokenizer's eos, stops generation but ends no turn.
    eos = tok.convert_tokens_to_ids("[EOS]")
    assert summary["against"]["stop_ids_from"]["tokenizer.eos_token"] == [eos]
    assert eos in summary["against"]["stop_ids"] and eos not in summary["against"]["turn_end_ids"]
    # With the config's default loop: 256 tokens for a finished answer, but this span was cut while
    # repeating one 2-token n-gram 30 times, which at a budget is a loop.
    config.pop("quality")
    (tmp_path / "kimi.yaml").write_text(yaml.safe_dump(config))
    main(args + ["--out", str(tmp_path / "b")])
    assert codes_by_line(tmp_path / "b")[0][2] == ["repetition_loop", "span_without_stop"]


@pytest.mark.parametrize("generation_config", [True, False])
def test_eos_tokens_on_the_command_line_are_stops_flagged_unexpected(tmp_path, qwen3_tokenizer_dir, generation_config):
    """Qwen3's <|endoftext|> named with --eos-tokens: an answer that ends on it is an unexpected_stop,
    with or without a generation_config.json beside the tokenizer; audit.json says which ids were which."""
    import shutil

    folder = tmp_path / "qwen3"
    shutil.copytree(qwen3_tokenizer_dir, folder)
    if generation_config:
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    model = defaults("model", name="q", tokenizer=str(folder), context_length=4096, stop_tokens=["<|im_end|>"])
    tok = load_tokenizer(ModelProfile.from_config(model))
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    prompt = tok.encode("user: what is 2 + 2? assistant:", add_special_tokens=False)
    answer = tok.encode("It is 4.", add_special_tokens=False)
    rows = [
        {"input_ids": prompt + answer + end, "loss_mask": [0] * len(prompt) + [1] * (len(answer) + 1)}
        for end in ([im_end], [endoftext])
    ]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    base = ["--data", str(data), "--tokenizer", str(folder), "--stop-tokens", "<|im_end|>"]
    summary = main(base + ["--eos-tokens", "<|endoftext|>", "--out", str(tmp_path / "a")])
    assert codes_by_line(tmp_path / "a")[0] == {1: [], 2: ["unexpected_stop"]}
    against = summary["against"]
    assert against["turn_end_ids"] == [im_end] and {im_end, endoftext} <= set(against["stop_ids"])
    assert against["stop_ids_from"]["model.eos_tokens"] == [endoftext]
    assert against["stop_ids_from"]["generation_config.json"] == (
        sorted([im_end, endoftext]) if generation_config else None
    )
    # Without --eos-tokens, <|endoftext|> stops only where the model's files say so; elsewhere the span
    # ends on no stop at all.
    main(base + ["--out", str(tmp_path / "b")])
    expected = ["unexpected_stop"] if generation_config else ["span_without_stop"]
    assert codes_by_line(tmp_path / "b")[0][2] == expected
