"""generate: one shard of a category through SGLang's native /generate, and merge_shards.

The generate job plans (which rows the journal already holds), starts or finds its servers, runs the
client, and assembles one generations row per prompt row, in prompt order. It never loads the
tokenizer: the token facts come with the prompts table (`templating.token_facts`).
"""

import asyncio
import json
import logging
from pathlib import Path

from .client import GenerateClient, RequestTemplate, ServerDied
from .journal import Journal
from .plan_generation import make_plan, make_template, open_journal, shard_rows
from .servers import api_key, job_facts, seeds_honoured, server_provenance, servers, terminate_on_sigterm
from .settings import ClientSettings, ModelProfile, stable_hash
from .tables import GENERATIONS_SCHEMA, read_provenance, read_rows, write_table

log = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    pass


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


def generate_category(
    prompt_rows: list[dict],
    *,
    facts: dict,
    profile: ModelProfile,
    sampling: dict,
    engine: dict,
    client_settings: ClientSettings,
    journal: Journal,
    server_log: Path,
    max_failed_share: float,
    category: str,
) -> tuple[list[dict], dict]:
    """Generate every usable row of a category; returns (generations rows, provenance).

    `facts` are the prompts table's token facts (provenance); `journal` keeps every finished row.
    """
    template = make_template(facts, profile, sampling, engine)
    provenance = {
        "model_fingerprint": template.model_fingerprint,
        "stop_token_ids": template.stop_token_ids,
        "job": job_facts(),
    }
    with journal, terminate_on_sigterm():
        todo = make_plan(prompt_rows, template, journal)
        provenance["plan"] = todo.summary()
        log.info("%s plan: %s", category, provenance["plan"])
        results = dict(todo.reused)
        if todo.to_send:
            key = api_key(engine)
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with servers(engine, profile=profile, log_path=server_log, key=key) as srv:
                provenance["servers"] = server_provenance(srv.urls, profile, headers)
                # A seed labels a row; it makes the row reproducible only where the server honours it.
                provenance["seeds_honoured"] = seeds_honoured(provenance["servers"])
                if not provenance["seeds_honoured"]:
                    log.warning(
                        "%s: the server runs without --enable-deterministic-inference: each row's seed is "
                        "recorded but does not make it reproducible (engine.deterministic_inference)",
                        category,
                    )
                client = GenerateClient(
                    srv.urls, template, client_settings, label=category, headers=headers, alive=srv.alive
                )
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


def generate(
    *,
    prompts: Path,
    shard_generations: Path,
    server_log: Path,
    category: str,
    shard: int,
    model: dict,
    sampling: dict,
    engine: dict,
    client: dict,
    max_failed_share: float,
    cache_dir: str,
    shards: int,
) -> None:
    """Generate one shard of a category into `shard_generations`."""
    params = {
        "model": model,
        "sampling": sampling,
        "engine": engine,
        "client": client,
        "max_failed_share": max_failed_share,
        "cache_dir": cache_dir,
        "shards": shards,
    }
    facts = read_provenance(prompts)
    label = category if shards == 1 else f"{category}[{shard}/{shards}]"
    rows, provenance = generate_category(
        shard_rows(read_rows(prompts), shard, shards),
        facts=facts,
        profile=ModelProfile.from_config(model),
        sampling=sampling,
        engine=engine,
        client_settings=ClientSettings.from_config(client),
        journal=open_journal(cache_dir, category, shard, shards),
        server_log=server_log,
        max_failed_share=max_failed_share,
        category=label,
    )
    provenance.update(
        {"prompts": facts, "params": params, "config_sha256": stable_hash(params), "shard": shard, "shards": shards}
    )
    write_table(rows, GENERATIONS_SCHEMA, shard_generations, provenance)
    log.info("%s: wrote %d rows to %s", label, len(rows), shard_generations)


def merge_shards(*, prompts: Path, shard_generations: list[Path], generations: Path) -> None:
    """Join a category's generate shards into one generations table, in prompt order."""
    rows = [r for path in shard_generations for r in read_rows(path)]
    prompt_rows = read_rows(prompts)
    if len(rows) != len(prompt_rows):
        raise RuntimeError(f"{generations}: the shards hold {len(rows)} rows, the prompts table {len(prompt_rows)}")
    first = {}
    for i, p in enumerate(prompt_rows):
        first.setdefault((p["id"], p["sample_index"]), i)
    rows.sort(key=lambda r: first[(r["id"], r["sample_index"])])  # stable: duplicates keep their order
    provenance = [read_provenance(path) for path in shard_generations]
    merged = dict(provenance[0])
    merged["shards"] = provenance
    write_table(rows, GENERATIONS_SCHEMA, generations, merged)
    log.info("merged %d shards, %d rows into %s", len(shard_generations), len(rows), generations)
