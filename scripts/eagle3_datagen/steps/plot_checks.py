"""Step plot_checks: the parser-check verdicts, reasoning share and finish reasons of every category,
each tallied from one streamed pass over its files and drawn by `figures`."""

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from eagle3_datagen.figures import plot_finish_reasons, plot_token_share, plot_verdicts
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.steps.check_parsers import VERDICTS
from eagle3_datagen.storage.tables import DEFAULT_BATCHING, Batching, iter_batches, iter_record_batches, read_provenance


@dataclass
class VerdictTally:
    """What the verdict figures need of a category: rows per verdict, reasoning and answer tokens."""

    verdicts: Counter = field(default_factory=Counter)
    reasoning_tokens: int = 0
    answer_tokens: int = 0

    @property
    def rows(self) -> int:
        return sum(self.verdicts.values())


def tally_verdicts(path: str | Path, batching: Batching = DEFAULT_BATCHING) -> VerdictTally:
    tally = VerdictTally()
    for batch in iter_batches(path, batching, columns=["verdict", "n_reasoning_tokens", "n_answer_tokens"]):
        tally.verdicts.update(r["verdict"] for r in batch)
        tally.reasoning_tokens += sum(r["n_reasoning_tokens"] for r in batch)
        tally.answer_tokens += sum(r["n_answer_tokens"] for r in batch)
    return tally


def tally_finishes(path: str | Path, reasoning_end_id: int | None, batching: Batching = DEFAULT_BATCHING) -> tuple:
    """Rows per way an answer ended (FINISHES), streamed; only truncated rows' ids are looked at."""
    stop = after = inside = loop = failed = skipped = 0
    for batch in iter_record_batches(path, batching, columns=["status", "finish_type", "output_ids"]):
        status = batch["status"].to_pylist()
        finish = batch["finish_type"].to_pylist()
        for i, (s, f) in enumerate(zip(status, finish)):
            if s == "failed":
                failed += 1
            elif s == "skipped":
                skipped += 1
            elif s == "ok" and f == LOOP_FINISH:
                loop += 1
            elif s == "ok" and f != "length":
                stop += 1
            elif s == "ok":
                output = batch["output_ids"][i].values.to_numpy()
                if reasoning_end_id is not None and not (output == reasoning_end_id).any():
                    inside += 1
                else:
                    after += 1
    return stop, after, inside, loop, failed, skipped


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
    by_category = {c: tally_verdicts(p, batching) for c, p in zip(categories, verdicts)}
    # The id of the reasoning end token, as tokenize_prompts read it from the tokenizer.
    reasoning_end = read_provenance(generations[0])["prompts"]["reasoning_end_id"] if generations else None
    finishes = {c: tally_finishes(p, reasoning_end, batching) for c, p in zip(categories, generations)}
    plot_verdicts(by_category, verdicts_png, VERDICTS)
    plot_token_share(by_category, token_share_png)
    plot_finish_reasons(finishes, finish_reasons_png)
