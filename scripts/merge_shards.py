"""Join a category's generate shards into one generations table, in prompt order. Run by rule merge_shards, or by hand (-h)."""

import argparse
import logging
from pathlib import Path

from eagle3_datagen.tables import GENERATIONS_SCHEMA, read_provenance, read_rows, write_table
from eagle3_datagen.workflow import setup_logging

log = logging.getLogger("merge_shards")


def main(prompts: Path, shards: list[Path], out: Path) -> None:
    rows = [r for path in shards for r in read_rows(path)]
    prompt_rows = read_rows(prompts)
    if len(rows) != len(prompt_rows):
        raise RuntimeError(f"{out}: the shards hold {len(rows)} rows, the prompts table {len(prompt_rows)}")
    first = {}
    for i, p in enumerate(prompt_rows):
        first.setdefault((p["id"], p["sample_index"]), i)
    rows.sort(key=lambda r: first[(r["id"], r["sample_index"])])  # stable: duplicates keep their order
    provenance = [read_provenance(path) for path in shards]
    merged = dict(provenance[0])
    merged["shards"] = provenance
    write_table(rows, GENERATIONS_SCHEMA, out, merged)
    log.info("merged %d shards, %d rows into %s", len(shards), len(rows), out)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(prompts=Path(sm.input.prompts), shards=[Path(p) for p in sm.input.shards], out=Path(sm.output.generations))
    else:
        parser = argparse.ArgumentParser(description=__doc__)
        parser.add_argument("--prompts", type=Path, required=True)
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("shards", nargs="+", type=Path)
        args = parser.parse_args()
        setup_logging()
        kwargs = dict(prompts=args.prompts, shards=args.shards, out=args.out)
    try:
        main(**kwargs)
    except Exception:
        log.exception("merge_shards failed")
        raise
