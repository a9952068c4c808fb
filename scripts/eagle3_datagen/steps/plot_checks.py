"""Step plot_checks: the parser-check verdicts, reasoning share and finish reasons of every category,
each tallied from one streamed pass over its files and drawn by `figures`."""

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_datagen.figures.base import by_series, save
from eagle3_datagen.figures.shares import draw_finish_reasons, draw_token_share, draw_verdicts
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.settings import DEFAULT_MODE
from eagle3_datagen.storage.tables import DEFAULT_BATCHING, Batching, iter_record_batches, iter_rows, read_provenance
from eagle3_datagen.tokens.chat_layer import VERDICTS


@dataclass
class VerdictTally:
    """What the verdict figures need of a category: rows per verdict, reasoning and answer tokens."""

    verdicts: Counter = field(default_factory=Counter)
    reasoning_tokens: int = 0
    answer_tokens: int = 0

    @property
    def rows(self) -> int:
        return sum(self.verdicts.values())


def tally_verdicts(path: str | Path, batching: Batching = DEFAULT_BATCHING) -> dict[str, VerdictTally]:
    """Per serving mode: rows per verdict, reasoning and answer tokens, streamed."""
    tallies: dict[str, VerdictTally] = {}
    for r in iter_rows(path, batching, columns=["mode", "verdict", "n_reasoning_tokens", "n_answer_tokens"]):
        tally = tallies.setdefault(r["mode"] or DEFAULT_MODE, VerdictTally())
        tally.verdicts[r["verdict"]] += 1
        tally.reasoning_tokens += r["n_reasoning_tokens"]
        tally.answer_tokens += r["n_answer_tokens"]
    return tallies


# The ways an answer ended, in the order `tally_finishes` counts them.
FINISH_KINDS = ("stop", "after", "inside", "loop", "failed", "skipped")


def tally_finishes(
    path: str | Path, reasoning_end_id: int | None, batching: Batching = DEFAULT_BATCHING
) -> dict[str, tuple]:
    """Per serving mode, rows per way an answer ended (FINISH_KINDS), streamed; only truncated rows'
    ids are looked at."""
    counts: dict[str, Counter] = {}
    for batch in iter_record_batches(path, batching, columns=["mode", "status", "finish_type", "output_ids"]):
        modes, status, finish = (batch[column].to_pylist() for column in ("mode", "status", "finish_type"))
        for i, (s, f) in enumerate(zip(status, finish)):
            c = counts.setdefault(modes[i] or DEFAULT_MODE, Counter())
            if s != "ok":
                c[s] += 1  # failed or skipped
            elif f == LOOP_FINISH:
                c["loop"] += 1
            elif f != "length":
                c["stop"] += 1
            else:
                output = batch["output_ids"][i].values.to_numpy()
                inside = reasoning_end_id is not None and not (output == reasoning_end_id).any()
                c["inside" if inside else "after"] += 1
    return {mode: tuple(c[k] for k in FINISH_KINDS) for mode, c in counts.items()}


def plot_checks(
    *,
    categories: list[str],
    verdicts: list[Path],
    generations: list[Path],
    verdicts_png: Path,
    token_share_png: Path,
    finish_reasons_png: Path,
    batch: dict | None = None,
) -> None:
    """Draw the parser-check verdicts, reasoning share and finish reasons of every category, each
    from one streamed pass over its files."""
    batching = Batching.from_config(batch)
    by_category = by_series({c: tally_verdicts(p, batching) for c, p in zip(categories, verdicts)})
    # The id of the reasoning end token, as tokenize_prompts read it from the tokenizer.
    reasoning_end = read_provenance(generations[0])["prompts"]["reasoning_end_id"] if generations else None
    finishes = by_series({c: tally_finishes(p, reasoning_end, batching) for c, p in zip(categories, generations)})
    save(draw_verdicts(by_category, VERDICTS), verdicts_png)
    save(draw_token_share(by_category), token_share_png)
    save(draw_finish_reasons(finishes), finish_reasons_png)
