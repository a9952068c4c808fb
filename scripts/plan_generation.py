"""Preview one shard of a category's generation: rows to send, already generated, skipped. Run by rule plan_generation, or by hand (-h).

It runs on the CPU before any server starts; the generate job reads it to decide how many GPUs to ask for.
"""

import json
import logging
from pathlib import Path

from eagle3_datagen.generation import open_journal, preview, shard_rows
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tables import read_rows
from eagle3_datagen.templating import load_tokenizer
from eagle3_datagen.workflow import cli_context, generate_params, setup_logging

log = logging.getLogger("plan_generation")


def main(prompts: Path, out: Path, *, category: str, shard: int, params: dict) -> None:
    profile = ModelProfile.from_config(params["model"])
    shards = params["shards"]
    summary = preview(
        shard_rows(read_rows(prompts), shard, shards),
        tokenizer=load_tokenizer(profile),
        profile=profile,
        sampling=params["sampling"],
        engine=params["engine"],
        journal=open_journal(params["cache_dir"], category, shard, shards, read_only=True),
    )
    summary = {"category": category, "shard": shard, "shards": shards, **summary}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s", summary)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(prompts=Path(sm.input.prompts), out=Path(sm.output.plan), category=sm.wildcards.category, shard=int(sm.wildcards.shard), params=sm.params.cfg)
    else:
        def extra(p):
            p.add_argument("--prompts", required=True)
            p.add_argument("--out", required=True)
            p.add_argument("--shard", type=int, default=0)
        args, config, row = cli_context(__doc__, extra)
        kwargs = dict(prompts=Path(args.prompts), out=Path(args.out), category=args.category, shard=args.shard, params=generate_params(config, row))
    try:
        main(**kwargs)
    except Exception:
        log.exception("plan_generation failed")
        raise
