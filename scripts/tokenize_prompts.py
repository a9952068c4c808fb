"""Tokenize one category's prompts with the model's chat template. Run by rule tokenize_prompts, or by hand (-h)."""

import logging
from pathlib import Path

from eagle3_datagen.prompt_table import build_prompt_rows
from eagle3_datagen.prompts import read_prompts
from eagle3_datagen.settings import Budget, ModelProfile
from eagle3_datagen.tables import PROMPTS_SCHEMA, write_table
from eagle3_datagen.templating import CONTROL_TOKEN_POLICY, ChatTokenizer, load_tokenizer, tokenizer_fingerprint
from eagle3_datagen.workflow import cli_context, setup_logging, tokenize_params

log = logging.getLogger("tokenize_prompts")


class BadRows(ValueError):
    pass


def main(prompts: Path, out: Path, *, category: str, params: dict) -> None:
    profile = ModelProfile.from_config(params["model"])
    tokenizer = load_tokenizer(profile)
    rows = read_prompts(prompts)
    for row in rows:
        if not row.ok:
            log.warning("skipped: %s", row.reason)
    table = build_prompt_rows(
        rows,
        ChatTokenizer(tokenizer, profile),
        profile=profile,
        budget=Budget(**params["budget"]),
        category=category,
        samples_per_prompt=params["samples_per_prompt"],
        base_seed=params["seed"],
    )
    skipped = [r["reason"] for r in table if r["status"] == "skipped" and r["sample_index"] == 0]
    if skipped and params.get("on_bad_rows") == "fail":
        listing = "\n  ".join(skipped[:50]) + (f"\n  ... and {len(skipped) - 50} more" if len(skipped) > 50 else "")
        raise BadRows(f"{len(skipped)} of {len(rows)} rows of {prompts} cannot be used (on_bad_rows: fail):\n  {listing}")
    provenance = {"prompts_file": str(prompts), **tokenizer_fingerprint(tokenizer), "control_token_policy": CONTROL_TOKEN_POLICY, "params": params}
    write_table(table, PROMPTS_SCHEMA, out, provenance)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(prompts=Path(sm.input.prompts), out=Path(sm.output.prompts), category=sm.wildcards.category, params=sm.params.cfg)
    else:
        args, config, row = cli_context(__doc__, lambda p: p.add_argument("--out", required=True))
        kwargs = dict(prompts=Path(row["prompts"]), out=Path(args.out), category=args.category, params=tokenize_params(config, row))
    try:
        main(**kwargs)
    except Exception:
        log.exception("tokenize_prompts failed")
        raise
