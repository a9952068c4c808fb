"""Draw the parser-check verdicts, reasoning share and finish reasons of every category. Run by rule plot_checks, or by hand (-h)."""

import argparse
import logging
from pathlib import Path

from eagle3_datagen.figures import plot_finish_reasons, plot_token_share, plot_verdicts
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tables import read_rows
from eagle3_datagen.templating import load_tokenizer, token_id
from eagle3_datagen.workflow import load_config, setup_logging

log = logging.getLogger("plot_checks")


def main(categories: list[str], checks: list[Path], generations: list[Path], *, model: dict, verdicts_png: Path, share_png: Path, finish_png: Path) -> None:
    profile = ModelProfile.from_config(model)
    reasoning_end = token_id(load_tokenizer(profile), profile.reasoning_end) if profile.reasoning_end else None
    verdicts = {c: read_rows(p) for c, p in zip(categories, checks)}
    gens = {c: read_rows(p) for c, p in zip(categories, generations)}
    plot_verdicts(verdicts, verdicts_png)
    plot_token_share(verdicts, share_png)
    plot_finish_reasons(gens, reasoning_end, finish_png)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(
            categories=list(sm.params.categories),
            checks=[Path(p) for p in sm.input.checks],
            generations=[Path(p) for p in sm.input.generations],
            model=sm.params.model,
            verdicts_png=Path(sm.output.verdicts),
            share_png=Path(sm.output.token_share),
            finish_png=Path(sm.output.finish_reasons),
        )
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("--config", default="config/config.yaml")
        parser.add_argument("--results", default="results", type=Path)
        parser.add_argument("categories", nargs="+")
        args = parser.parse_args()
        setup_logging()
        res = args.results
        kwargs = dict(
            categories=args.categories,
            checks=[res / "checks" / f"{c}.parquet" for c in args.categories],
            generations=[res / "generations" / f"{c}.parquet" for c in args.categories],
            model=load_config(args.config)["model"],
            verdicts_png=res / "plots" / "verdicts.png",
            share_png=res / "plots" / "token_share.png",
            finish_png=res / "plots" / "finish_reasons.png",
        )
    try:
        main(**kwargs)
    except Exception:
        log.exception("plot_checks failed")
        raise
