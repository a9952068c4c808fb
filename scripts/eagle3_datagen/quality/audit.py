"""The audit of a trainer row made elsewhere (SpecForge's, speculators', this pipeline's
`results/dataset/`): its raw-token checks and its flags, read from ids only.

Each loss span (a maximal run of `loss_mask` 1) is an assistant output, the tokens before it its
prompt, judged by `flags.row_flags` as if generated: `stop` where it ends on a stop id, else
`length`. A chat template renders a newline after the turn end (Qwen3's `<|im_end|>\\n`, which
speculators' rows keep under the loss), so a stop id followed only by whitespace ids ends the span.
The raw checks (`RAW_CODES`) are described in docs/data.md.
"""

from dataclasses import dataclass

import numpy as np

from eagle3_datagen.quality.flags import CODES, Flag, QualityFacts, row_flags
from eagle3_datagen.quality.loops import LoopSettings

RAW_CODES = (
    "unreadable_row",
    "id_out_of_vocab",
    "missing_loss_mask",
    "mask_length_mismatch",
    "mask_not_binary",
    "no_loss_tokens",
    "span_without_stop",
)
AUDIT_CODES = RAW_CODES + CODES


@dataclass(frozen=True)
class AuditSettings:
    """What a row is audited against: the tokenizer's facts, the loop detector, the vocabulary size."""

    facts: QualityFacts
    loop: LoopSettings
    vocab_size: int


def loss_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of 1 in a 0/1 mask, in order."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def output_end(ids: np.ndarray, start: int, end: int, facts: QualityFacts) -> int | None:
    """Where the output of span `ids[start:end]` ends (after its stop id: its last id, or its last
    non-whitespace id, before the chat template's newline), or None: it ends on no stop."""
    i = end - 1
    while i >= start and int(ids[i]) in facts.whitespace_ids and int(ids[i]) not in facts.stop_ids:
        i -= 1
    return i + 1 if i >= start and int(ids[i]) in facts.stop_ids else None


def _int_array(value, kinds: str = "iu") -> np.ndarray | None:
    """The value as an int64 array, or None: not a list of integers (numpy `kinds`: a mask may be booleans)."""
    if not isinstance(value, list):
        return None
    if not value:
        return np.zeros(0, dtype=np.int64)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        return None
    return array.astype(np.int64) if array.ndim == 1 and array.dtype.kind in kinds else None


def _mask_flags(mask_value, n_ids: int) -> tuple[np.ndarray | None, list[Flag]]:
    """(the mask, when spans can be read from it; the flags against it)."""
    if mask_value is None:
        return None, [Flag("missing_loss_mask", "the row has no loss_mask")]
    mask = _int_array(mask_value, "iub")
    if mask is None:
        return None, [Flag("mask_not_binary", "loss_mask is not a list of integers")]
    flags = []
    if mask.size != n_ids:
        flags.append(Flag("mask_length_mismatch", f"loss_mask has {mask.size} values for {n_ids} input_ids"))
    odd = np.unique(mask[(mask != 0) & (mask != 1)])
    if odd.size:
        flags.append(Flag("mask_not_binary", f"loss_mask holds values other than 0 and 1: {odd[:5].tolist()}"))
    if flags:
        return None, flags
    if not mask.any():
        return None, [Flag("no_loss_tokens", f"no loss token among {n_ids} tokens")]
    return mask, []


def span_flags(ids: np.ndarray, mask: np.ndarray, settings: AuditSettings) -> list[Flag]:
    """The flags of each loss span of a row, judged as a generated output after its prompt."""
    spans = loss_spans(mask)
    flags = []
    for k, (start, end) in enumerate(spans, 1):
        where = f"span {k}/{len(spans)} (tokens {start}-{end - 1})"
        stop_end = output_end(ids, start, end, settings.facts)
        if stop_end is None:
            flags.append(Flag("span_without_stop", f"{where} ends on id {int(ids[end - 1])}, no stop id"))
        finish = "length" if stop_end is None else "stop"
        found = row_flags(
            ids[:start].tolist(), ids[start : stop_end or end].tolist(), finish, settings.facts, settings.loop
        )
        flags += [Flag(f.code, f"{where}: {f.detail}") for f in found]
    return flags


def audit_row(row, settings: AuditSettings) -> list[Flag]:
    """Every flag of one parsed row (empty: nothing to say against it), raw checks first."""
    if not isinstance(row, dict):
        return [Flag("unreadable_row", f"the line is a JSON {type(row).__name__}, not an object")]
    if "input_ids" not in row:
        return [Flag("unreadable_row", "the row has no input_ids")]
    ids = _int_array(row["input_ids"])
    if ids is None:
        return [Flag("unreadable_row", "input_ids is not a list of integers")]
    if not ids.size:
        return [Flag("unreadable_row", "input_ids is empty")]
    mask, flags = _mask_flags(row.get("loss_mask"), ids.size)
    outside = np.flatnonzero((ids < 0) | (ids >= settings.vocab_size))
    if outside.size:
        first = int(outside[0])
        detail = (
            f"{outside.size} ids outside 0..{settings.vocab_size - 1}, the first {int(ids[first])} at position {first}"
        )
        flags = [Flag("id_out_of_vocab", detail), *flags]
    if mask is not None:
        flags += span_flags(ids, mask, settings)
    return flags
