"""The check that a draft vocabulary belongs to the data and the tokenizer it is trained with.

    eagle3-datagen vocab-check --vocab results/vocab --train results/train/train.jsonl \\
        --tokenizer /models/Kimi-K2.5 --trust-remote-code

A mapping counted on other data or another tokenizer's ids trains without error and collapses
acceptance. The command exits 1 with the differences, 0 when there are none.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from eagle3_datagen.storage.disk import file_sha256

PROVENANCE = "provenance.json"


def _given(name: str, recorded, given) -> list[str]:
    """A difference where a value is given and differs from the recorded one."""
    if given is None or recorded == given:
        return []
    return [f"{name}: the mapping was built with {recorded}, here it is {given}"]


def _data(record: dict, train: Path) -> list[str]:
    built = record.get("train") or {}
    if not train.is_file():
        return [f"data: {train} does not exist"]
    sha = file_sha256(train)
    if sha == built.get("sha256"):
        return []
    return [
        f"data: {train} has sha256 {sha} ({train.stat().st_size} bytes); the mapping was counted on "
        f"{built.get('path')} with sha256 {built.get('sha256')} ({built.get('bytes')} bytes, "
        f"{record.get('rows')} rows, {record.get('loss_tokens')} loss tokens)"
    ]


def _files(record: dict, vocab: Path) -> list[str]:
    """The mapping's own files: each as written, and d2t/t2d of the recorded sizes."""
    found = []
    for name, sha in (record.get("files") or {}).items():
        path = vocab / name
        if not path.is_file():
            found.append(f"files: {path} is missing")
        elif file_sha256(path) != sha:
            found.append(f"files: {path} changed after the mapping was built (sha256 differs from {PROVENANCE})")
    for name, key in (("d2t.npy", "draft_vocab_size"), ("t2d.npy", "target_vocab_size")):
        if (vocab / name).is_file():
            shape = np.load(vocab / name, mmap_mode="r").shape
            if shape != (record.get(key),):
                found.append(f"{key}: {name} has shape {shape}, {PROVENANCE} records {record.get(key)}")
    return found


def check_vocab(
    vocab: Path,
    train: Path,
    tokenizer: dict | None = None,
    *,
    draft_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
    max_length: int | None = None,
) -> list[str]:
    """Every way the mapping in `vocab` does not belong to `train` and the tokenizer (empty: it does),
    by its `provenance.json`. `tokenizer` is `tokenizer_fingerprint` of the tokenizer at hand; the
    sizes and `max_length`, when given, are those the trainer is configured with."""
    path = vocab / PROVENANCE
    if not path.is_file():
        return [f"provenance: {path} is missing, so nothing says what the mapping was built from; build it again"]
    record = json.loads(path.read_text())
    found = _data(record, train)
    if tokenizer is not None:
        if tokenizer["tokenizer_sha256"] != record.get("tokenizer_sha256"):
            found.append(
                f"tokenizer: its sha256 is {tokenizer['tokenizer_sha256']}, the mapping's ids are those of "
                f"a tokenizer with sha256 {record.get('tokenizer_sha256')}"
            )
        found += _given("tokenizer length", record.get("tokenizer_vocab_size"), tokenizer["vocab_size"])
    found += _given("draft_vocab_size", record.get("draft_vocab_size"), draft_vocab_size)
    found += _given("target_vocab_size", record.get("target_vocab_size"), target_vocab_size)
    found += _given("max_length", record.get("max_length"), max_length)
    return found + _files(record, vocab)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=prog, description="Refuse a draft vocabulary built from other data or another tokenizer."
    )
    p.add_argument("--vocab", required=True, type=Path, help="the mapping's folder (results/vocab)")
    p.add_argument("--train", required=True, type=Path, help="the data it will be trained with (train.jsonl)")
    p.add_argument("--tokenizer", help="the target's tokenizer folder")
    p.add_argument("--trust-remote-code", action="store_true", help="load a tokenizer that ships its own code")
    p.add_argument("--draft-vocab-size", type=int, help="the trainer's draft vocabulary size")
    p.add_argument("--target-vocab-size", type=int, help="the trainer's target vocabulary size")
    p.add_argument("--max-length", type=int, help="the trainer's maximum sequence length")
    args = p.parse_args(argv)
    fingerprint = None
    if args.tokenizer:
        from eagle3_datagen.settings import ModelProfile
        from eagle3_datagen.tokens.vocabulary import load_tokenizer, tokenizer_fingerprint

        profile = ModelProfile(
            name="", tokenizer=args.tokenizer, context_length=1, trust_remote_code=args.trust_remote_code
        )
        fingerprint = tokenizer_fingerprint(load_tokenizer(profile))
    found = check_vocab(
        args.vocab,
        args.train,
        fingerprint,
        draft_vocab_size=args.draft_vocab_size,
        target_vocab_size=args.target_vocab_size,
        max_length=args.max_length,
    )
    for line in found:
        print(f"vocab_check: {line}", file=sys.stderr)
    if not found:
        what = "and this tokenizer" if fingerprint else "(the tokenizer not checked: no --tokenizer)"
        print(f"vocab_check: {args.vocab} was built from {args.train} {what}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
