"""Generate one category's answers through SGLang's native /generate. Run by rule generate, or by hand (-h)."""

import logging
from pathlib import Path

from eagle3_datagen.generation import generate_category, journal_path
from eagle3_datagen.settings import ClientSettings, ModelProfile
from eagle3_datagen.tables import GENERATIONS_SCHEMA, read_provenance, read_rows, write_table
from eagle3_datagen.templating import load_tokenizer
from eagle3_datagen.workflow import cli_context, generate_params, setup_logging

log = logging.getLogger("generate")


def main(prompts: Path, out: Path, *, category: str, params: dict, server_log: Path) -> None:
    profile = ModelProfile.from_config(params["model"])
    tokenizer = load_tokenizer(profile)
    prompt_rows = read_rows(prompts)
    rows, provenance = generate_category(
        prompt_rows,
        tokenizer=tokenizer,
        profile=profile,
        sampling=params["sampling"],
        engine=params["engine"],
        client_settings=ClientSettings.from_config(params["client"]),
        journal_path=journal_path(params["cache_dir"], category),
        server_log=server_log,
        max_failed_share=params["max_failed_share"],
        category=category,
    )
    provenance.update({"prompts": read_provenance(prompts), "params": params})
    write_table(rows, GENERATIONS_SCHEMA, out, provenance)
    log.info("%s: wrote %d rows to %s", category, len(rows), out)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log.client)
        kwargs = dict(
            prompts=Path(sm.input.prompts),
            out=Path(sm.output.generations),
            category=sm.wildcards.category,
            params=sm.params.cfg,
            server_log=Path(sm.log.server),
        )
    else:
        def extra(p):
            p.add_argument("--prompts", required=True)
            p.add_argument("--out", required=True)
            p.add_argument("--server-log", default="logs/generate/server.log")
        args, config, row = cli_context(__doc__, extra)
        kwargs = dict(prompts=Path(args.prompts), out=Path(args.out), category=args.category, params=generate_params(config, row), server_log=Path(args.server_log))
    try:
        main(**kwargs)
    except Exception:
        log.exception("generate failed")
        raise
