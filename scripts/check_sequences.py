"""Check raw-token invariants of one category's generations; fails on any violation. Run by rule check_sequences, or by hand (-h)."""

import json
import logging
from pathlib import Path

from eagle3_datagen.checks import check_sequences
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tables import read_rows
from eagle3_datagen.templating import load_tokenizer
from eagle3_datagen.workflow import cli_context, setup_logging

log = logging.getLogger("check_sequences")


class SequenceViolation(RuntimeError):
    pass


def main(generations: Path, prompts: Path, out: Path, *, model: dict) -> None:
    profile = ModelProfile.from_config(model)
    report = check_sequences(read_rows(generations), read_rows(prompts), tokenizer=load_tokenizer(profile), profile=profile)
    if report.violations:
        raise SequenceViolation(report.message())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    log.info("%d rows checked, no violations", report.checked)


if __name__ == "__main__":
    sm = globals().get("snakemake")
    if sm is not None:
        setup_logging(sm.log[0])
        kwargs = dict(generations=Path(sm.input.generations), prompts=Path(sm.input.prompts), out=Path(sm.output.report), model=sm.params.model)
    else:
        def extra(p):
            p.add_argument("--generations", required=True)
            p.add_argument("--prompts", required=True)
            p.add_argument("--out", required=True)
        args, config, _ = cli_context(__doc__, extra)
        kwargs = dict(generations=Path(args.generations), prompts=Path(args.prompts), out=Path(args.out), model=config["model"])
    try:
        main(**kwargs)
    except Exception:
        log.exception("check_sequences failed")
        raise
