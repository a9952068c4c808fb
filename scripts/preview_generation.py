"""Collect every category's plan into one table: the cost preview. Run by rule preview_generation, or by hand (-h)."""

import argparse
import json
import logging
from pathlib import Path

import pandas as pd

from eagle3_datagen.workflow import setup_logging

log = logging.getLogger("preview_generation")


def main(plans: list[Path], out: Path) -> None:
    frame = pd.DataFrame([json.loads(p.read_text()) for p in plans])
    out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, sep="\t", index=False)
    log.info("generation preview:\n%s", frame.to_string(index=False))


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(plans=[Path(p) for p in sm.input.plans], out=Path(sm.output.preview))
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("plans", nargs="+", type=Path)
        parser.add_argument("--out", type=Path, required=True)
        args = parser.parse_args()
        setup_logging()
        kwargs = dict(plans=args.plans, out=args.out)
    try:
        main(**kwargs)
    except Exception:
        log.exception("preview_generation failed")
        raise
