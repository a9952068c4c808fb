"""Generate one category: plan what needs the server, run the client, assemble the generations table."""

import asyncio
import hashlib
import json
import logging
import os
import re
import signal
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .client import GenerateClient, Request, RequestTemplate, ServerDied, check_server_info, fetch_json
from .journal import Journal
from .lifecycle import ManagedServer, free_port, local_engine_command, sglang_command
from .settings import ClientSettings, ModelProfile
from .templating import token_ids, tokenizer_fingerprint

log = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    pass


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


def make_template(tokenizer, profile: ModelProfile, sampling: dict, engine: dict) -> RequestTemplate:
    fingerprint = {
        "model": profile.name,
        **tokenizer_fingerprint(tokenizer),
        "chat_template_kwargs": profile.chat_template_kwargs,
        "sglang_version": profile.sglang_version,
        "server": server_fingerprint(engine),
    }
    return RequestTemplate(
        sampling=dict(sampling),
        stop_token_ids=token_ids(tokenizer, profile.stop_tokens),
        vocab_size=len(tokenizer),
        model_fingerprint=fingerprint,
    )


def plan(prompt_rows: list[dict], template: RequestTemplate, journal: Journal | None) -> Plan:
    result = Plan()
    for row in prompt_rows:
        if row["status"] != "ok":
            result.skipped += 1
            continue
        req = Request(row["id"], int(row["sample_index"]), list(row["prompt_ids"]), int(row["max_new_tokens"]), int(row["seed"]))
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


def preview(prompt_rows: list[dict], *, tokenizer, profile: ModelProfile, sampling: dict, engine: dict, journal: Journal) -> dict:
    """What generating these rows would cost now, without sending anything or starting a server."""
    template = make_template(tokenizer, profile, sampling, engine)
    return plan(prompt_rows, template, journal).summary()


def assemble(prompt_rows: list[dict], results: dict, template: RequestTemplate) -> list[dict]:
    """One generations row per prompt row, in prompt order; skipped rows carry their reason."""
    rows = []
    for p in prompt_rows:
        key = (p["id"], int(p["sample_index"]))
        r = results.get(key)
        base = {
            "id": p["id"],
            "sample_index": p["sample_index"],
            "category": p["category"],
            "prompt_ids": p["prompt_ids"],
            "sampling": json.dumps(template.sampling, sort_keys=True),
            "seed": p["seed"],
            "max_new_tokens": p["max_new_tokens"],
        }
        if p["status"] != "ok":
            rows.append({**base, "output_ids": [], "status": p["status"], "error": p["reason"], "attempts": 0})
        elif r is None:
            raise RuntimeError(f"row {key} has no result: this is a bug")
        else:
            rows.append(
                {
                    **base,
                    "output_ids": r.get("output_ids", []),
                    "finish_type": r.get("finish_type", ""),
                    "finish_matched": r.get("finish_matched", ""),
                    "completion_tokens": r.get("completion_tokens", 0),
                    "cached_tokens": r.get("cached_tokens", 0),
                    "e2e_latency": r.get("e2e_latency", 0.0),
                    "attempts": r.get("attempts", 0),
                    "status": r["status"],
                    "error": r.get("error", ""),
                }
            )
    return rows


@contextmanager
def terminate_on_sigterm():
    """SLURM and Snakemake stop jobs with SIGTERM: turn it into SystemExit so servers get stopped."""

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def api_key(engine: dict) -> str | None:
    """The server's API key, from the environment variable the config names (never from the config)."""
    name = engine.get("api_key_env")
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise RuntimeError(f"engine.api_key_env names {name}, but that environment variable is not set")
    return key


@dataclass
class Servers:
    urls: list[str]
    managed: ManagedServer | None = None

    def alive(self) -> bool:
        return self.managed is None or self.managed.alive()


@contextmanager
def servers(engine: dict, *, profile: ModelProfile, log_path: Path, record_name: str, key: str | None):
    """Where to send requests: a server this job launches (`sglang`, `local`), or running ones (`external`)."""
    kind = engine["kind"]
    if kind == "external":
        yield Servers(list(engine["external"]["urls"]))
        return
    port = free_port()
    if kind == "sglang":
        cmd = sglang_command(engine, port=port, context_length=profile.context_length, api_key=key)
    else:
        record_dir = engine["local"].get("record_dir")
        # The engine's own record of what it served: tests compare exported data against it.
        record = str(Path(record_dir) / record_name) if record_dir else None
        cmd = local_engine_command(engine, port=port, context_length=profile.context_length, tokenizer=profile.tokenizer, record=record)
    server = ManagedServer(cmd, port=port, log_path=log_path, startup_timeout_s=float(engine.get("startup_timeout_s", 600)))
    with server as url:
        yield Servers([url], server)


SECRET_KEYS = re.compile(r"api_key|token|secret|password", re.IGNORECASE)


def without_secrets(obj):
    """A copy of a server's answer fit for provenance: values of secret-looking keys hidden."""
    if isinstance(obj, dict):
        return {k: ("***" if SECRET_KEYS.search(str(k)) and v else without_secrets(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [without_secrets(v) for v in obj]
    return obj


def job_facts() -> dict:
    """Where the job ran: the cluster's job id and the GPUs it was given, for provenance."""
    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


async def _server_provenance(urls: list[str], profile: ModelProfile, headers: dict) -> dict:
    infos = {}
    for url in urls:
        server_info = await fetch_json(f"{url}/get_server_info", headers=headers)
        for warning in check_server_info(server_info, context_length=profile.context_length, url=url):
            log.warning(warning)
        model_info = await fetch_json(f"{url}/get_model_info", headers=headers)
        infos[url] = {"server_info": without_secrets(server_info), "model_info": without_secrets(model_info)}
    return infos


def generate_category(
    prompt_rows: list[dict],
    *,
    tokenizer,
    profile: ModelProfile,
    sampling: dict,
    engine: dict,
    client_settings: ClientSettings,
    journal: Journal,
    server_log: Path,
    max_failed_share: float,
    category: str,
    record_name: str = "engine.jsonl",
) -> tuple[list[dict], dict]:
    """Generate every usable row of a category; returns (generations rows, provenance)."""
    template = make_template(tokenizer, profile, sampling, engine)
    provenance = {"model_fingerprint": template.model_fingerprint, "stop_token_ids": template.stop_token_ids, "job": job_facts()}
    with journal, terminate_on_sigterm():
        todo = plan(prompt_rows, template, journal)
        provenance["plan"] = todo.summary()
        log.info("%s plan: %s", category, provenance["plan"])
        results = dict(todo.reused)
        if todo.to_send:
            key = api_key(engine)
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with servers(engine, profile=profile, log_path=server_log, record_name=record_name, key=key) as srv:
                provenance["servers"] = asyncio.run(_server_provenance(srv.urls, profile, headers))
                client = GenerateClient(srv.urls, template, client_settings, label=category, headers=headers, alive=srv.alive)
                try:
                    results.update(asyncio.run(client.run(todo.to_send, journal)))
                except ServerDied as exc:
                    raise ServerDied(
                        f"{category}: {exc}; its log is {server_log}. The journal {journal.path} keeps "
                        "every finished row: rerun to resume."
                    ) from None
                provenance["client"] = {
                    "run_nonce": client.run_nonce,
                    "requests_per_s": round(client.requests_per_s, 3),
                    "tokens_per_s": round(client.tokens_per_s, 1),
                }
    rows = assemble(prompt_rows, results, template)
    attempted = [r for r in rows if r["status"] in ("ok", "failed")]
    failed = [r for r in attempted if r["status"] == "failed"]
    share = len(failed) / len(attempted) if attempted else 0.0
    if share > max_failed_share:
        examples = "; ".join(f"{r['id']}.{r['sample_index']}: {r['error']}" for r in failed[:5])
        raise TooManyFailures(
            f"{category}: {len(failed)} of {len(attempted)} rows failed ({share:.1%} > max_failed_share "
            f"{max_failed_share:.1%}); the journal {journal.path} keeps the finished rows, and a rerun sends only "
            f"the failed ones. First failures: {examples}"
        )
    return rows, provenance
