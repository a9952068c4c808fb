"""Would the OpenAI chat route (reasoning and tool parsers, re-templating) give back the exact tokens? Run by rule check_parsers, or by hand (-h).

Reports a verdict per row; never fails the workflow.
"""

import json
import logging
from pathlib import Path

import pyarrow as pa

from eagle3_datagen.parser_check import check_rows, counts
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tables import read_rows, write_table
from eagle3_datagen.templating import load_tokenizer
from eagle3_datagen.workflow import cli_context, setup_logging

log = logging.getLogger("check_parsers")

VERDICT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("sample_index", pa.int32()),
        ("verdict", pa.string()),
        ("first_diff", pa.int64()),
        ("excerpt_expected", pa.string()),
        ("excerpt_route", pa.string()),
        ("n_reasoning_tokens", pa.int32()),
        ("n_answer_tokens", pa.int32()),
        ("has_tools", pa.bool_()),
        ("finish_type", pa.string()),
    ]
)


def main(generations: Path, prompts: Path, *, rows_out: Path, counts_out: Path, model: dict) -> None:
    profile = ModelProfile.from_config(model)
    verdicts = check_rows(read_rows(generations), read_rows(prompts), tokenizer=load_tokenizer(profile), profile=profile)
    write_table(verdicts, VERDICT_SCHEMA, rows_out, {"reasoning_parser": profile.reasoning_parser, "tool_call_parser": profile.tool_call_parser, "sglang_version": profile.sglang_version})
    summary = {"reasoning_parser": profile.reasoning_parser, "tool_call_parser": profile.tool_call_parser, "sglang_version": profile.sglang_version, "verdicts": counts(verdicts)}
    counts_out.parent.mkdir(parents=True, exist_ok=True)
    counts_out.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s", summary)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(generations=Path(sm.input.generations), prompts=Path(sm.input.prompts), rows_out=Path(sm.output.rows), counts_out=Path(sm.output.counts), model=sm.params.model)
    else:
        def extra(p):
            p.add_argument("--generations", required=True)
            p.add_argument("--prompts", required=True)
            p.add_argument("--out-prefix", required=True, help="writes PREFIX.parquet and PREFIX.json")
        args, config, _ = cli_context(__doc__, extra)
        kwargs = dict(generations=Path(args.generations), prompts=Path(args.prompts), rows_out=Path(args.out_prefix + ".parquet"), counts_out=Path(args.out_prefix + ".json"), model=config["model"])
    try:
        main(**kwargs)
    except Exception:
        log.exception("check_parsers failed")
        raise
