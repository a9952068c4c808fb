"""Generate one shard of a category through SGLang's native /generate. Run by rule generate, or by hand (-h)."""

import logging
from pathlib import Path

from eagle3_datagen.generation import generate_category, open_journal, shard_rows
from eagle3_datagen.settings import ClientSettings, ModelProfile, stable_hash
from eagle3_datagen.tables import GENERATIONS_SCHEMA, read_provenance, read_rows, write_table
from eagle3_datagen.templating import load_tokenizer
from eagle3_datagen.workflow import cli_context, generate_params, setup_logging

log = logging.getLogger("generate")


def main(prompts: Path, out: Path, *, category: str, shard: int, params: dict, server_log: Path) -> None:
    profile = ModelProfile.from_config(params["model"])
    tokenizer = load_tokenizer(profile)
    shards = params["shards"]
    prompt_rows = shard_rows(read_rows(prompts), shard, shards)
    label = category if shards == 1 else f"{category}[{shard}/{shards}]"
    rows, provenance = generate_category(
        prompt_rows,
        tokenizer=tokenizer,
        profile=profile,
        sampling=params["sampling"],
        engine=params["engine"],
        client_settings=ClientSettings.from_config(params["client"]),
        journal=open_journal(params["cache_dir"], category, shard, shards),
        server_log=server_log,
        max_failed_share=params["max_failed_share"],
        category=label,
        record_name=f"{category}.jsonl",
    )
    provenance.update({"prompts": read_provenance(prompts), "params": params, "config_sha256": stable_hash(params), "shard": shard, "shards": shards})
    write_table(rows, GENERATIONS_SCHEMA, out, provenance)
    log.info("%s: wrote %d rows to %s", label, len(rows), out)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log.client)
        kwargs = dict(
            prompts=Path(sm.input.prompts),
            out=Path(sm.output.generations),
            category=sm.wildcards.category,
            shard=int(sm.wildcards.shard),
            params=sm.params.cfg,
            server_log=Path(sm.log.server),
        )
    else:

        def extra(p):
            p.add_argument("--prompts", required=True)
            p.add_argument("--out", required=True)
            p.add_argument("--shard", type=int, default=0)
            p.add_argument("--server-log", default="logs/generate/server.log")

        args, config, row = cli_context(__doc__, extra)
        kwargs = dict(prompts=Path(args.prompts), out=Path(args.out), category=args.category, shard=args.shard, params=generate_params(config, row), server_log=Path(args.server_log))
    try:
        main(**kwargs)
    except Exception:
        log.exception("generate failed")
        raise
