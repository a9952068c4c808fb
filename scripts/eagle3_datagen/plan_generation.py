"""plan_generation: which rows of a shard need the server, on the CPU and before any server starts.

Here live the request fingerprints (what identifies a generation, so that the journal doubles as a
cache), the shard a row belongs to, and the plan: rows to send, rows already generated (reused from
the journal) and rows skipped. The plan file doubles as the cost preview (`preview_generation`
collects them into results/plan.tsv) and sizes the generate job's GPU request.
"""

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .client import Request, RequestTemplate
from .journal import Journal
from .settings import ModelProfile
from .tables import read_provenance, read_rows

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """Which rows of a category need the server, and which are already done or skipped."""

    to_send: list[Request] = field(default_factory=list)
    reused: dict = field(default_factory=dict)
    skipped: int = 0

    def summary(self) -> dict:
        """The cost preview: what a run would send, and what it already has."""
        return {
            "to_send": len(self.to_send),
            "reused": len(self.reused),
            "skipped": self.skipped,
            "prompt_tokens_to_send": sum(len(r.prompt_ids) for r in self.to_send),
            "max_new_tokens_to_send": sum(r.max_new_tokens for r in self.to_send),
        }


# Weights up to this size are hashed whole; larger checkpoints are identified by file names and sizes.
FULL_HASH_LIMIT = 256 * 1024 * 1024


def model_dir_fingerprint(model_dir: str | Path) -> str:
    """sha256 of a model directory's config and weights, cheap enough for any checkpoint size."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    for name in ("config.json", "generation_config.json"):
        if (root / name).exists():
            digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    weights = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    whole = sum(p.stat().st_size for p in weights) <= FULL_HASH_LIMIT
    for p in weights:
        digest.update(f"{p.name}:{p.stat().st_size}".encode())
        if whole:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def server_fingerprint(engine: dict) -> dict:
    """What identifies the server's model, known before any server starts.

    For an external server nothing can be read before the run: model.name (part of the model
    fingerprint) identifies what it serves, so change the name when the served model changes.
    """
    if engine["kind"] == "local":
        local = engine["local"]
        fingerprint = {"kind": "local", "backend": local["backend"]}
        if local["backend"] == "model":
            fingerprint["weights"] = model_dir_fingerprint(local["model_dir"])
        return fingerprint
    return {"kind": engine["kind"]}


def make_template(facts: dict, profile: ModelProfile, sampling: dict, engine: dict) -> RequestTemplate:
    """The request parts shared by every row, from the token facts of the prompts table."""
    fingerprint = {
        "model": profile.name,
        "tokenizer_sha256": facts["tokenizer_sha256"],
        "chat_template_sha256": facts["chat_template_sha256"],
        "vocab_size": facts["vocab_size"],
        "chat_template_kwargs": profile.chat_template_kwargs,
        "sglang_version": profile.sglang_version,
        "server": server_fingerprint(engine),
    }
    return RequestTemplate(
        sampling=dict(sampling),
        stop_token_ids=list(facts["stop_token_ids"]),
        vocab_size=int(facts["vocab_size"]),
        model_fingerprint=fingerprint,
    )


def make_plan(prompt_rows: list[dict], template: RequestTemplate, journal: Journal | None) -> Plan:
    result = Plan()
    for row in prompt_rows:
        if row["status"] != "ok":
            result.skipped += 1
            continue
        req = Request(
            row["id"], int(row["sample_index"]), list(row["prompt_ids"]), int(row["max_new_tokens"]), int(row["seed"])
        )
        req.fingerprint = template.fingerprint(req)
        entry = journal.reusable(req.fingerprint) if journal is not None else None
        if entry is not None:
            result.reused[req.key] = entry
        else:
            result.to_send.append(req)
    return result


def shard_of(row_id: str, shards: int) -> int:
    """The shard a row belongs to: stable, so adding prompts moves no existing row."""
    return int(hashlib.sha256(row_id.encode("utf-8")).hexdigest()[:12], 16) % shards


def shard_rows(prompt_rows: list[dict], shard: int, shards: int) -> list[dict]:
    return [r for r in prompt_rows if shard_of(r["id"], shards) == shard]


def journal_path(cache_dir: str | Path, category: str, shard: int, shards: int) -> Path:
    return Path(cache_dir) / "journal" / category / f"shard_{shard}-of-{shards}.jsonl"


def open_journal(cache_dir: str | Path, category: str, shard: int, shards: int, *, read_only: bool = False) -> Journal:
    """The shard's journal, reusing what every journal of the category holds (shard counts may change)."""
    path = journal_path(cache_dir, category, shard, shards)
    others = sorted(path.parent.glob("*.jsonl")) if path.parent.exists() else []
    return Journal(path, read_only=read_only, also_read=others)


def plan_generation(
    *,
    prompts: Path,
    plan: Path,
    category: str,
    shard: int,
    model: dict,
    sampling: dict,
    engine: dict,
    cache_dir: str,
    shards: int,
) -> dict:
    """Write the plan of one shard: rows to send, already generated, skipped (no server, no tokenizer)."""
    template = make_template(read_provenance(prompts), ModelProfile.from_config(model), sampling, engine)
    journal = open_journal(cache_dir, category, shard, shards, read_only=True)
    summary = {
        "category": category,
        "shard": shard,
        "shards": shards,
        **make_plan(shard_rows(read_rows(prompts), shard, shards), template, journal).summary(),
    }
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s", summary)
    return summary


def preview_generation(*, plan: list[Path], preview: Path) -> None:
    """Collect every shard's plan into one table: the cost preview, before any GPU time is spent."""
    import pandas as pd

    frame = pd.DataFrame([json.loads(p.read_text()) for p in plan])
    preview.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(preview, sep="\t", index=False)
    log.info("generation preview:\n%s", frame.to_string(index=False))
