"""What each rule needs from the config, computed in one place for the Snakefile and the command line.

Rules pass these as `params:`, so Snakemake reruns a category exactly when its own effective
parameters change, and scripts never read the global config.
"""

import logging
import sys
from pathlib import Path

import yaml

from .settings import max_new_tokens_for, sampling_for


def load_sheet(path: str | Path):
    import pandas as pd

    sheet = pd.read_csv(path, sep="\t", dtype={"category": str, "prompts": str}, comment="#")
    if "category" in sheet.columns:
        sheet = sheet.set_index("category", drop=False)
    return sheet


def validate_sheet(sheet, schema_path: str | Path, sheet_path: str | Path) -> None:
    """Check every row of the category sheet; an error names the sheet's file, line and field."""
    import jsonschema

    with open(schema_path) as fh:
        schema = yaml.safe_load(fh)
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    if "category" not in sheet.columns or "prompts" not in sheet.columns:
        raise ValueError(f"{sheet_path}: the sheet needs the columns 'category' and 'prompts' (tab-separated)")
    for line, record in enumerate(sheet.to_dict("records"), start=2):  # line 1 is the header
        record = {k: v for k, v in record.items() if v == v}  # empty cells
        for key, value in list(record.items()):
            if isinstance(value, float) and value.is_integer():
                record[key] = int(value)
        for error in sorted(validator.iter_errors(record), key=lambda e: list(e.path)):
            where = f"field '{error.path[0]}'" if error.path else "row"
            problems.append(f"{sheet_path}:{line}: {where}: {error.message}")
    duplicated = sheet["category"][sheet["category"].duplicated()].tolist()
    if duplicated:
        problems.append(f"{sheet_path}: category names must be unique; repeated: {', '.join(map(str, duplicated))}")
    if problems:
        raise ValueError("invalid category sheet:\n  " + "\n  ".join(problems))


def category_row(sheet, category: str) -> dict:
    return {k: v for k, v in sheet.loc[category].to_dict().items() if v == v}  # drop NaN cells


def tokenize_params(config: dict, category: dict) -> dict:
    return {
        "model": config["model"],
        "budget": {
            "max_new_tokens": max_new_tokens_for(config, category),
            "min_new_tokens": int(config["min_new_tokens"]),
            "reserve_tokens": int(config["reserve_tokens"]),
        },
        "samples_per_prompt": int(category.get("samples_per_prompt", config["samples_per_prompt"])),
        "seed": int(config["seed"]),
        "on_bad_rows": config.get("on_bad_rows", "quarantine"),
    }


def generate_params(config: dict, category: dict) -> dict:
    return {
        "model": config["model"],
        "sampling": sampling_for(config, category),
        "engine": config["engine"],
        "client": config["client"],
        "max_failed_share": float(config["max_failed_share"]),
        "cache_dir": str(config["cache_dir"]),
        "shards": shard_count(category),
    }


def shard_count(category: dict) -> int:
    """Generate jobs of a category: each its own server (and GPU job), so N nodes run N at once."""
    return int(category.get("shards", 1))


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """The config as Snakemake would see it, validated against the schema (for command-line use)."""
    from snakemake.utils import validate

    with open(path) as fh:
        config = yaml.safe_load(fh)
    config.update(overrides or {})
    validate(config, str(Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"))
    return config


def setup_logging(log_file: str | Path | None = None, level: int = logging.INFO) -> None:
    """Configure logging once: to the rule's log file, or to stderr when run by hand."""
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers: list[logging.Handler] = [logging.FileHandler(log_file)]
    else:
        handlers = [logging.StreamHandler(sys.stderr)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True)


def cli_context(description: str, extra=None):
    """Arguments shared by every entry point run by hand: the config file and the category."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
    parser.add_argument("--category", help="category name from the category sheet")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    setup_logging()
    config = load_config(args.config)
    row = category_row(load_sheet(config["categories"]), args.category) if args.category else None
    return args, config, row


def generate_gpus(engine: dict, plan_file: str | Path) -> int:
    """GPUs a generate job asks for: the launched server's, and none when nothing is left to send."""
    import json

    if json.loads(Path(plan_file).read_text())["to_send"] == 0:
        return 0
    if engine["kind"] == "sglang":
        return int(engine["sglang"].get("tp_size", 1))
    if engine["kind"] == "local":
        return int(engine["local"].get("gpus", 0))
    return 0


def generate_job(engine: dict) -> dict:
    """CPUs, memory and wall time of a generate job (defaults of schemas/config.schema.yaml)."""
    job = engine.get("job") or {}
    return {"cpus": int(job.get("cpus", 4)), "mem_mb": int(job.get("mem_mb", 16000)), "runtime": int(job.get("runtime", 1440))}


def check_engine(engine: dict) -> None:
    """Refuse, before any job runs, an engine configuration that would corrupt data."""
    from .lifecycle import check_extra_args

    if engine["kind"] == "sglang":
        if "sglang" not in engine:
            raise ValueError("engine.kind is sglang but engine.sglang (model_path, tp_size, ...) is missing")
        check_extra_args([str(a) for a in engine["sglang"].get("extra_args") or []])
    if engine["kind"] == "external" and not (engine.get("external") or {}).get("urls"):
        raise ValueError("engine.kind is external but engine.external.urls is empty")
