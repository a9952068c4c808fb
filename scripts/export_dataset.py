"""Export one category as trainer-ready input_ids/loss_mask rows. Run by rule export_dataset, or by hand (-h)."""

import logging
from pathlib import Path

from eagle3_datagen.export import Filters, export_category
from eagle3_datagen.tables import read_rows
from eagle3_datagen.workflow import cli_context, setup_logging

log = logging.getLogger("export_dataset")


def main(generations: Path, *, jsonl: Path, parquet: Path, rejected: Path, export: dict) -> None:
    counts = export_category(read_rows(generations), Filters.from_config(export), jsonl=jsonl, parquet=parquet, rejected=rejected)
    log.info("%s: %s", generations, counts)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(generations=Path(sm.input.generations), jsonl=Path(sm.output.jsonl), parquet=Path(sm.output.parquet), rejected=Path(sm.output.rejected), export=sm.params.export)
    else:
        def extra(p):
            p.add_argument("--generations", required=True)
            p.add_argument("--out-prefix", required=True, help="writes PREFIX.jsonl, PREFIX.parquet, PREFIX.rejected.jsonl")
        args, config, _ = cli_context(__doc__, extra)
        prefix = args.out_prefix
        kwargs = dict(generations=Path(args.generations), jsonl=Path(prefix + ".jsonl"), parquet=Path(prefix + ".parquet"), rejected=Path(prefix + ".rejected.jsonl"), export=config["export"])
    try:
        main(**kwargs)
    except Exception:
        log.exception("export_dataset failed")
        raise
