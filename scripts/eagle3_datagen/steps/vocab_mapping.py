"""The loss tokens' frequencies and the draft vocabulary, in the files both trainers read (docs/data.md).

One pass over `train.jsonl` counts every loss-masked token id and takes its sha256. The draft
vocabulary follows speculators' `build_vocab_mappings_from_distribution`; `provenance.json` records
what it was built from, so that `steps.vocab_check` can refuse it for other data or another tokenizer.
"""

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import orjson

from eagle3_datagen.settings import ExportSettings
from eagle3_datagen.storage.disk import file_sha256
from eagle3_datagen.storage.tables import read_provenance

log = logging.getLogger(__name__)

FLUSH_TOKENS = 4_000_000


def loss_token_counts(path: Path, vocab_size: int, digest=None) -> tuple[np.ndarray, int]:
    """(count per target id of the loss-masked tokens of a dataset JSONL file, rows read); `digest`
    (a hashlib object), when given, is fed every byte of the file on the way."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    held: list[np.ndarray] = []
    n_held = rows = 0

    def flush():
        nonlocal held, n_held
        if held:
            ids = np.concatenate(held)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise ValueError(f"{path}: a loss token id outside the target vocabulary of {vocab_size}")
            counts[:] += np.bincount(ids, minlength=vocab_size)[:vocab_size]
        held, n_held = [], 0

    with open(path, "rb") as fh:
        for line in fh:
            if digest is not None:
                digest.update(line)
            if not line.strip():
                continue
            row = orjson.loads(line)
            ids = np.asarray(row["input_ids"], dtype=np.int64)
            mask = np.asarray(row["loss_mask"], dtype=bool)
            held.append(ids[mask])
            n_held += held[-1].size
            rows += 1
            if n_held >= FLUSH_TOKENS:
                flush()
    flush()
    return counts, rows


def draft_vocabulary(counts: np.ndarray, draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(d2t, t2d) of the `draft_vocab_size` most frequent ids, ties to the lower id, padded with the
    lowest unused ids when fewer were seen; target id = draft index + d2t[draft index]."""
    vocab_size = counts.size
    if draft_vocab_size > vocab_size:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} is larger than the target vocabulary {vocab_size}")
    seen = np.flatnonzero(counts)
    order = seen[np.lexsort((seen, -counts[seen]))]  # count descending, then id ascending
    selected = order[:draft_vocab_size]
    pad = np.setdiff1d(np.arange(draft_vocab_size), selected)[: draft_vocab_size - selected.size]
    chosen = np.sort(np.concatenate([selected, pad]).astype(np.int64))
    d2t = chosen - np.arange(draft_vocab_size, dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[chosen] = True
    return d2t, t2d


def target_vocab_size(prompts: list[Path], export: ExportSettings) -> int:
    if export.target_vocab_size:
        return export.target_vocab_size
    sizes = {int(read_provenance(p)["vocab_size"]) for p in prompts}
    if len(sizes) != 1:
        raise ValueError(f"the categories were tokenized with vocabularies of different sizes: {sorted(sizes)}")
    return sizes.pop()


def prompts_tokenizer(prompts: list[Path]) -> dict:
    """The tokenizer the categories were tokenized with: its sha256 and length (one for all of them)."""
    records = [read_provenance(p) for p in prompts]
    seen = {(r.get("tokenizer_sha256"), r.get("vocab_size")) for r in records}
    if len(seen) != 1:
        raise ValueError(f"the categories were tokenized with different tokenizers: {sorted(seen, key=str)}")
    sha, size = seen.pop()
    return {"tokenizer_sha256": sha, "tokenizer_vocab_size": size}


def vocab_mapping(
    *,
    train: Path,
    prompts: list[Path],
    token_freq: Path,
    vocab_mapping: Path,
    d2t: Path,
    t2d: Path,
    export: dict,
    vocab_provenance: Path | None = None,
) -> dict:
    """Count train.jsonl's loss tokens once and write the frequencies, the draft vocabulary and what
    they were built from (`vocab_provenance`)."""
    import torch

    settings = ExportSettings.from_config(export)
    size, draft = target_vocab_size(prompts, settings), settings.draft_vocab_size
    digest = hashlib.sha256()
    counts, rows = loss_token_counts(train, size, digest)
    d2t_array, t2d_array = draft_vocabulary(counts, draft)
    token_freq.parent.mkdir(parents=True, exist_ok=True)
    nonzero = np.flatnonzero(counts)
    torch.save({int(i): int(counts[i]) for i in nonzero}, token_freq)
    torch.save({"d2t": torch.from_numpy(d2t_array), "t2d": torch.from_numpy(t2d_array)}, vocab_mapping)
    np.save(d2t, d2t_array)
    np.save(t2d, t2d_array)
    covered = int(counts[t2d_array].sum())
    summary = {
        "rows": rows,
        "loss_tokens": int(counts.sum()),
        "distinct_loss_tokens": int(nonzero.size),
        "target_vocab_size": size,
        "draft_vocab_size": draft,
        "loss_tokens_in_draft_vocab": round(covered / max(int(counts.sum()), 1), 6),
    }
    log.info("%s", json.dumps(summary))
    if vocab_provenance is not None:
        record = {
            "train": {"path": str(train), "sha256": digest.hexdigest(), "bytes": train.stat().st_size},
            **summary,
            **prompts_tokenizer(prompts),
            "max_length": settings.filters.get("max_length"),
            "files": {p.name: file_sha256(p) for p in (token_freq, vocab_mapping, d2t, t2d)},
        }
        vocab_provenance.write_text(json.dumps(record, indent=2) + "\n")
    return summary
