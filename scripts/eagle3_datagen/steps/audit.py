"""Audit: the quality gate run on a trainer dataset made elsewhere, without any server (docs/data.md).

    eagle3-datagen audit --data train.jsonl --config config/qwen3.yaml \\
        --tokenizer /models/Qwen3-8B --out results/audit/NAME/

Every row (JSON lines or this pipeline's Parquet, streamed) is judged by `quality.audit.audit_row`;
a line that is not JSON is a row flagged `unreadable_row` and the rest of the file is still audited.
"""

import argparse
import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from eagle3_datagen.figures.base import pyplot, save
from eagle3_datagen.quality.audit import AUDIT_CODES, AuditSettings, audit_row
from eagle3_datagen.quality.flags import Flag, QualityFacts, QualitySettings
from eagle3_datagen.settings import SCHEMA_PATH, ModelProfile, defaults
from eagle3_datagen.storage.tables import iter_rows as table_rows
from eagle3_datagen.tokens.token_facts import token_facts
from eagle3_datagen.tokens.vocabulary import load_tokenizer

log = logging.getLogger(__name__)

PARQUET_COLUMNS = ("input_ids", "loss_mask", "id", "sample_index", "turn", "mode")
KEPT_KEYS = ("sample_index", "turn", "mode")  # carried from a row into its record beside its id, where present


def iter_rows(path: Path) -> Iterator[tuple[int, object, str | None]]:
    """(1-based line or row number, the parsed row or None, why it could not be read or None)."""
    if path.suffix == ".parquet":
        names = pq.ParquetFile(path).schema_arrow.names
        rows = table_rows(path, columns=[c for c in PARQUET_COLUMNS if c in names])
        yield from ((number, row, None) for number, row in enumerate(rows, 1))
        return
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield number, orjson.loads(line), None
            except orjson.JSONDecodeError as exc:
                yield number, None, f"not JSON: {exc}"


def audit_settings(model: dict, quality: dict | None = None, vocab_size: int | None = None) -> tuple:
    """(AuditSettings, what they were read from) for a config's `model` and `quality` sections."""
    profile = ModelProfile.from_config(model)
    tokenizer = load_tokenizer(profile)
    facts = token_facts(tokenizer, profile)
    loop = QualitySettings.from_config(quality).loop
    size = int(vocab_size) if vocab_size else len(tokenizer)
    settings = AuditSettings(facts=QualityFacts.from_token_facts(facts), loop=loop, vocab_size=size)
    against = {
        "tokenizer": profile.tokenizer,
        "tokenizer_sha256": facts["tokenizer_sha256"],
        "vocab_size": size,
        # Turn ends end an answer normally; every other stop id is an unexpected_stop.
        "turn_end_ids": sorted(settings.facts.turn_end_ids),
        "stop_ids": sorted(settings.facts.stop_ids),
        "stop_ids_from": facts["stop_set"]["sources"],
        "reasoning_start_id": settings.facts.reasoning_start_id,
        "reasoning_end_id": settings.facts.reasoning_end_id,
        "loop": loop.to_json(),
    }
    return settings, against


def audit(*, data: Path, out: Path, settings: AuditSettings, against: dict | None = None) -> dict:
    """Audit every row of `data` into `out`: flags.jsonl, reasons.tsv and .png, audit.json (returned)."""
    out.mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    rows = clean = 0
    with open(out / "flags.jsonl", "wb") as fh:
        for number, row, error in iter_rows(data):
            flags = [Flag("unreadable_row", error)] if error else audit_row(row, settings)
            record = {"line": number, "id": row.get("id") if isinstance(row, dict) else None}
            if isinstance(row, dict):
                record.update({k: row[k] for k in KEPT_KEYS if k in row})
            record["flags"] = [{"code": f.code, "detail": f.detail} for f in flags]
            fh.write(orjson.dumps(record) + b"\n")
            rows += 1
            clean += not flags
            counts.update({f.code for f in flags})
    with open(out / "reasons.tsv", "w") as fh:
        fh.write("code\trows\tshare\n")
        for code in AUDIT_CODES:
            fh.write(f"{code}\t{counts[code]}\t{counts[code] / max(rows, 1):.6f}\n")
    plot_reasons(counts, rows, clean, out / "reasons.png", title=data.name)
    summary = {
        "data": str(data),
        "rows": rows,
        "clean_rows": clean,
        "flagged_rows": rows - clean,
        "rows_per_code": {code: counts[code] for code in AUDIT_CODES},
        "against": against or {},
    }
    (out / "audit.json").write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s: %d rows, %d clean; %s", data, rows, clean, dict(+counts))
    return summary


def plot_reasons(counts: Counter, rows: int, clean: int, path: Path, *, title: str) -> None:
    """Share of rows flagged per code (a row may carry several codes), with the row counts."""
    plt = pyplot()
    codes = list(AUDIT_CODES)
    shares = [counts[c] / max(rows, 1) for c in codes]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.4 * len(codes)))
    bars = ax.barh(codes[::-1], shares[::-1], color="tab:red")
    for bar, code in zip(bars, codes[::-1]):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {counts[code]}", va="center", fontsize=8)
    ax.set_xlim(0, max(max(shares, default=0) * 1.15, 0.05))
    ax.set_xlabel("share of rows flagged")
    ax.set_title(f"Audit of {title}: {rows} rows, {clean} clean")
    save(fig, path)


def read_config(path: str) -> dict:
    """A pipeline config, validated against the schema (which fills its defaults)."""
    import yaml
    from snakemake.utils import validate

    with open(path) as fh:
        config = yaml.safe_load(fh)
    validate(config, str(SCHEMA_PATH))
    return config


def model_section(args: argparse.Namespace, config: dict) -> dict:
    """The model profile: the config's `model` section, or the options; the options override it."""
    model = dict(config.get("model") or {})
    if args.tokenizer:
        model["tokenizer"] = args.tokenizer
    if "tokenizer" not in model:
        raise SystemExit("audit: --tokenizer is needed (or --config with a model.tokenizer)")
    model.setdefault("name", Path(model["tokenizer"]).name)
    model.setdefault("context_length", 1 << 30)
    for key in ("stop_tokens", "eos_tokens", "reasoning_start", "reasoning_end"):
        if getattr(args, key) is not None:
            model[key] = getattr(args, key)
    if args.trust_remote_code:
        model["trust_remote_code"] = True
    if not model.get("stop_tokens"):
        raise SystemExit("audit: --stop-tokens is needed (or --config with model.stop_tokens)")
    return defaults("model", **model)


def parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Audit a trainer dataset (input_ids, loss_mask) made elsewhere.")
    p.add_argument("--data", required=True, type=Path, help="the dataset: JSON lines, or this pipeline's Parquet")
    p.add_argument("--out", required=True, type=Path, help="folder for flags.jsonl, reasons.tsv, reasons.png")
    p.add_argument("--config", help="a pipeline config: its model profile and quality.loop")
    p.add_argument("--tokenizer", help="the tokenizer folder (overrides the config's model.tokenizer)")
    p.add_argument("--vocab-size", type=int, help="ids must be below this (default: the tokenizer's length)")
    p.add_argument("--stop-tokens", nargs="+", help="tokens that end a turn (model.stop_tokens)")
    p.add_argument(
        "--eos-tokens",
        nargs="+",
        help="tokens that stop generation without ending a turn, flagged unexpected_stop (model.eos_tokens)",
    )
    p.add_argument("--reasoning-start", help="the token that opens the reasoning (model.reasoning_start)")
    p.add_argument("--reasoning-end", help="the token that ends the reasoning (model.reasoning_end)")
    p.add_argument("--trust-remote-code", action="store_true", help="load a tokenizer that ships its own code")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    args = parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = read_config(args.config) if args.config else {}
    settings, against = audit_settings(model_section(args, config), config.get("quality"), args.vocab_size)
    return audit(data=args.data, out=args.out, settings=settings, against=against)


if __name__ == "__main__":
    main()
