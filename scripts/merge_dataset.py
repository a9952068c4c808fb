"""Merge every category's dataset into one deduplicated train.jsonl. Run by rule merge_dataset, or by hand (-h)."""

import argparse
import logging
from pathlib import Path

from eagle3_datagen.export import merge_datasets
from eagle3_datagen.workflow import setup_logging

log = logging.getLogger("merge_dataset")


def main(datasets: list[Path], out: Path) -> None:
    log.info("merged %d files into %s: %s", len(datasets), out, merge_datasets(datasets, out))


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(datasets=[Path(p) for p in sm.input.datasets], out=Path(sm.output.train))
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("datasets", nargs="+")
        parser.add_argument("--out", required=True)
        args = parser.parse_args()
        setup_logging()
        kwargs = dict(datasets=[Path(p) for p in args.datasets], out=Path(args.out))
    try:
        main(**kwargs)
    except Exception:
        log.exception("merge_dataset failed")
        raise
