"""Build the demo's Kimi-K2.5-shaped tokenizer and tiny CPU model. Run by rule build_demo_model, or by hand (-h)."""

import argparse
import logging
from pathlib import Path

from eagle3_datagen.fixtures import build_demo_model
from eagle3_datagen.workflow import setup_logging

log = logging.getLogger("build_demo_model")


def main(out_dir: Path, *, steps: int, seed: int) -> None:
    build_demo_model(out_dir, steps=steps, seed=seed)
    log.info("demo model written to %s", out_dir)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(out_dir=Path(sm.output.model).parent, steps=sm.params.steps, seed=sm.params.seed)
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("out_dir", type=Path)
        parser.add_argument("--steps", type=int, default=120)
        parser.add_argument("--seed", type=int, default=0)
        args = parser.parse_args()
        setup_logging()
        kwargs = dict(out_dir=args.out_dir, steps=args.steps, seed=args.seed)
    try:
        main(**kwargs)
    except Exception:
        log.exception("build_demo_model failed")
        raise
