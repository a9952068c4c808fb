"""Count every row by status, tokens in and out, and draw the length figure. Run by rule summarize, or by hand (-h)."""

import argparse
import logging
from pathlib import Path

from eagle3_datagen.figures import plot_lengths
from eagle3_datagen.summary import category_summary, read_jsonl, write_summary
from eagle3_datagen.tables import read_rows
from eagle3_datagen.workflow import setup_logging

log = logging.getLogger("summarize")


def main(categories: list[str], generations: list[Path], rejected: list[Path], *, summary: Path, lengths_plot: Path) -> None:
    rows, lengths = [], {}
    for category, gen_path, rej_path in zip(categories, generations, rejected):
        gens = read_rows(gen_path)
        rows.append(category_summary(category, gens, read_jsonl(rej_path)))
        ok = [g for g in gens if g["status"] == "ok"]
        lengths[category] = ([len(g["prompt_ids"]) for g in ok], [len(g["output_ids"]) for g in ok])
    frame = write_summary(rows, summary)
    plot_lengths(lengths, lengths_plot)
    log.info("summary:\n%s", frame.to_string(index=False))


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(
            categories=list(sm.params.categories),
            generations=[Path(p) for p in sm.input.generations],
            rejected=[Path(p) for p in sm.input.rejected],
            summary=Path(sm.output.summary),
            lengths_plot=Path(sm.output.lengths),
        )
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("--results", default="results")
        parser.add_argument("categories", nargs="+")
        args = parser.parse_args()
        setup_logging()
        res = Path(args.results)
        kwargs = dict(
            categories=args.categories,
            generations=[res / "generations" / f"{c}.parquet" for c in args.categories],
            rejected=[res / "dataset" / f"{c}.rejected.jsonl" for c in args.categories],
            summary=res / "summary.tsv",
            lengths_plot=res / "plots" / "lengths.png",
        )
    try:
        main(**kwargs)
    except Exception:
        log.exception("summarize failed")
        raise
