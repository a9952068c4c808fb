"""A draft vocabulary knows its data: results/vocab/provenance.json records what the mapping was built
from, and the check refuses the mapping with another train.jsonl, another tokenizer or other sizes."""

import hashlib
import json

import numpy as np
import pytest

from conftest import conversations
from eagle3_datagen.steps.vocab_check import check_vocab, main
from eagle3_datagen.steps.vocab_mapping import vocab_mapping

EXPORT = {"draft_vocab_size": 16, "filters": {"max_length": 512}}
FILES = ("token_freq.pt", "vocab_mapping.pt", "d2t.npy", "t2d.npy")


def train_rows(n: int, shift: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        ids = [100 + i, 200, 300 + i] + [1000 + (i + k + shift) % 40 for k in range(12)]
        rows.append({"input_ids": ids, "loss_mask": [0, 0, 0] + [1] * 12})
    return rows


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def built(tmp_path, make_prompts):
    prompts, _ = make_prompts(conversations(2))
    train = write(tmp_path / "train" / "train.jsonl", train_rows(6))
    vocab = tmp_path / "vocab"
    vocab_mapping(
        train=train,
        prompts=[prompts],
        **{name.split(".")[0]: vocab / name for name in FILES},
        export=EXPORT,
        vocab_provenance=vocab / "provenance.json",
    )
    return vocab, train


def run(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def test_the_provenance_records_the_data_the_tokenizer_and_the_sizes(built, qwen3_tokenizer_dir):
    vocab, train = built
    record = json.loads((vocab / "provenance.json").read_text())
    rows = train_rows(6)
    assert record["train"]["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest()
    assert record["rows"] == len(rows) and record["loss_tokens"] == sum(sum(r["loss_mask"]) for r in rows)
    assert record["draft_vocab_size"] == 16 and record["max_length"] == 512
    assert record["target_vocab_size"] == record["tokenizer_vocab_size"] == np.load(vocab / "t2d.npy").size
    assert sorted(record["files"]) == sorted(FILES)


def test_the_mapping_is_accepted_with_its_own_data_and_tokenizer(built, qwen3_tokenizer_dir, capsys):
    vocab, train = built
    code, err = run(
        capsys,
        "--vocab",
        vocab,
        "--train",
        train,
        "--tokenizer",
        qwen3_tokenizer_dir,
        "--draft-vocab-size",
        16,
        "--max-length",
        512,
    )
    assert code == 0, err


def test_the_mapping_is_refused_with_other_data(built, qwen3_tokenizer_dir, capsys):
    vocab, train = built
    other = write(train.parent / "other.jsonl", train_rows(6, shift=1))  # same shape, other loss tokens
    code, err = run(capsys, "--vocab", vocab, "--train", other, "--tokenizer", qwen3_tokenizer_dir)
    assert code == 1 and "data:" in err and "tokenizer" not in err.replace(str(qwen3_tokenizer_dir), "")
    write(train, train_rows(6) + train_rows(1, shift=5))  # train.jsonl rewritten in place with one row more
    code, err = run(capsys, "--vocab", vocab, "--train", train)
    assert code == 1 and "data:" in err and "6 rows" in err


def test_the_mapping_is_refused_with_another_tokenizer(built, kimi_tiktoken_dir, capsys):
    vocab, train = built
    code, err = run(capsys, "--vocab", vocab, "--train", train, "--tokenizer", kimi_tiktoken_dir, "--trust-remote-code")
    assert code == 1 and "tokenizer: its sha256" in err and "tokenizer length" in err and "data:" not in err


def test_other_sizes_and_a_changed_file_are_refused(built):
    vocab, train = built
    assert check_vocab(vocab, train) == []
    found = check_vocab(vocab, train, draft_vocab_size=32, target_vocab_size=151_936, max_length=2048)
    assert [line.split(":")[0] for line in found] == ["draft_vocab_size", "target_vocab_size", "max_length"]
    np.save(vocab / "d2t.npy", np.zeros(32, dtype=np.int64))  # another mapping's file put in its place
    found = check_vocab(vocab, train)
    assert any(line.startswith("files:") and "d2t.npy" in line for line in found)
    assert any(line.startswith("draft_vocab_size: d2t.npy has shape (32,)") for line in found)
    (vocab / "provenance.json").unlink()
    assert check_vocab(vocab, train)[0].startswith("provenance:")
