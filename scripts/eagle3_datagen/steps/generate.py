"""generate: one shard of a category through SGLang's native /generate, and merge_shards.

The generate job plans (which turns the journal already holds), starts or finds its servers, runs the
client, and assembles the generations rows, in prompt order: one per turn of each conversation. The
token facts come with the prompts table (`templating.token_facts`); the tokenizer is loaded only to
make a conversation's later turns (`turns`), never for single-turn rows.
"""

import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from eagle3_datagen.generation.client import GenerateClient, Request, ServerDied, run_loop
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.locks import ShardLock
from eagle3_datagen.generation.servers import (
    api_key,
    attempt_logs,
    job_facts,
    seeds_honoured,
    server_provenance,
    servers,
    terminate_on_sigterm,
)
from eagle3_datagen.generation.turns import TurnBuilder, follower, walk
from eagle3_datagen.settings import ClientSettings, ModelProfile, stable_hash
from eagle3_datagen.steps.plan_generation import (
    journal_path,
    make_builder,
    make_plan,
    open_journal,
    requests_to_send,
    shard_of,
    shard_rows,
)
from eagle3_datagen.storage.prompts import without_source
from eagle3_datagen.storage.tables import (
    GENERATIONS_SCHEMA,
    Batching,
    TableWriter,
    count_rows,
    iter_batches,
    iter_record_batches,
    iter_rows,
    read_provenance,
)

log = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    pass


def assemble(
    prompt_rows: Iterable[dict], builder: TurnBuilder, result_of: Callable[[Request], dict | None]
) -> Iterator[dict]:
    """The generations rows of the prompt rows, in prompt order: one per turn of each conversation
    (a single-turn row: one), skipped rows with their reason, and each turn a conversation did not
    reach as a skipped row saying why it ended.

    `result_of(request)` gives the journalled result of a request."""
    sampling = json.dumps(builder.template.sampling, sort_keys=True)
    for p in prompt_rows:
        base = {
            "id": p["id"],
            "sample_index": p["sample_index"],
            "category": p["category"],
            "tools": p.get("tools") or "",
            "sampling": sampling,
        }
        if p["status"] != "ok":
            yield {
                **base,
                "turn": 0,
                "messages": p["messages"],
                "prompt_ids": p["prompt_ids"],
                "seed": p["seed"],
                "max_new_tokens": p["max_new_tokens"],
                "output_ids": [],
                "status": p["status"],
                "error": p["reason"],
                "attempts": 0,
            }
            # A conversation that ends before its first turn is sent (its first prompt is too long,
            # say) loses its later turns as one that ends later does: each is a row with the reason.
            yield from _unreached_turns(base, 1, rows_of(p), f"turn 0 was not sent: {without_source(p['reason'])}")
            continue
        conversation = builder.start(p)
        for step in walk(conversation, result_of):
            req, r = step.request, step.result
            if r is None:
                raise RuntimeError(f"row {req.label} has no result: this is a bug")
            yield {
                **base,
                "turn": req.turn,
                "messages": conversation.history_json(),
                "prompt_ids": req.prompt_ids,
                "seed": req.seed,
                "max_new_tokens": req.max_new_tokens,
                "output_ids": r.get("output_ids", []),
                "finish_type": r.get("finish_type", ""),
                "finish_matched": r.get("finish_matched", ""),
                "completion_tokens": r.get("completion_tokens", 0),
                "cached_tokens": r.get("cached_tokens", 0),
                "e2e_latency": r.get("e2e_latency", 0.0),
                "num_retractions": r.get("num_retractions", 0),
                "queue_time": r.get("queue_time", 0.0),
                "attempts": r.get("attempts", 0),
                "status": r["status"],
                "error": r.get("error", ""),
            }
        yield from _unreached_turns(base, conversation.turn + 1, conversation.turns, conversation.end_reason)


def _unreached_turns(base: dict, first: int, turns: int, why: str | None) -> Iterator[dict]:
    """Skipped rows for the turns `first`..`turns - 1` that a conversation did not reach, and why it ended."""
    for turn in range(first, turns):
        yield {
            **base,
            "turn": turn,
            "messages": "",
            "prompt_ids": [],
            "seed": 0,
            "max_new_tokens": 0,
            "output_ids": [],
            "status": "skipped",
            "error": f"conversation ended: {why}",
            "attempts": 0,
        }


def journalled_result(journal: Journal) -> Callable[[Request], dict | None]:
    """A request's result after a run: the ok entry made by exactly this request (reused or new),
    else what this run journalled for its row (a failure)."""

    def result_of(req: Request) -> dict | None:
        return journal.reusable(req.fingerprint) or journal.entry(req.key)

    return result_of


class FailureCount:
    """Attempted and failed rows of a shard, counted as they are written."""

    def __init__(self):
        self.attempted = self.failed = 0
        self.examples: list[str] = []

    def count(self, rows: Iterable[dict]) -> Iterator[dict]:
        for r in rows:
            if r["status"] in ("ok", "failed"):
                self.attempted += 1
            if r["status"] == "failed":
                self.failed += 1
                if len(self.examples) < 5:
                    turn = f".t{r['turn']}" if r["turn"] else ""
                    self.examples.append(f"{r['id']}.{r['sample_index']}{turn}: {r['error']}")
            yield r


def generate_category(
    prompt_rows: Callable[[], Iterable[dict]],
    *,
    facts: dict,
    profile: ModelProfile,
    sampling: dict,
    engine: dict,
    budget: dict,
    client_settings: ClientSettings,
    journal: Journal,
    server_log: Path,
    max_failed_share: float,
    category: str,
    writer: TableWriter,
    may_send: bool = True,
) -> dict:
    """Generate every usable row of a category into `writer`; returns the provenance.

    `prompt_rows()` reads the shard's prompt rows anew (planning, sending and writing each go
    through them once, a batch at a time); `facts` are the prompts table's token facts
    (provenance); `journal` keeps every finished row and is where results are read back from.
    """
    builder = make_builder(facts, profile, sampling, engine, budget)
    template = builder.template
    provenance = {
        "model_fingerprint": template.model_fingerprint,
        "stop_token_ids": template.stop_token_ids,
        "job": job_facts(),
    }
    with journal, terminate_on_sigterm():
        todo = make_plan(prompt_rows(), builder, journal)
        provenance["plan"] = todo.summary()
        log.info("%s plan: %s", category, provenance["plan"])
        if todo.to_send and not may_send:
            raise RuntimeError(
                f"{category}: its plan had nothing to send, but the journal {journal.path} now lacks {todo.to_send} "
                "rows (was it moved?): rerun, and its plan sends them from a GPU job"
            )
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
                # A conversation's next turn is made from its answer as soon as the answer is journalled.
                # (Only where there are later turns: each entry waits for its answer's follow-up.)
                in_flight: dict | None = {} if todo.later_turns else None
                requests = requests_to_send(prompt_rows(), builder, journal, in_flight)

                try:
                    run_loop(
                        client.run(
                            requests,
                            journal,
                            total=todo.to_send + todo.later_turns,
                            keep_results=False,
                            follow=follower(in_flight) if todo.later_turns else None,
                        )
                    )
                except ServerDied as exc:
                    raise ServerDied(
                        f"{category}: {exc}; its log is {server_log}. The journal {journal.path} keeps "
                        "every finished row: rerun to resume."
                    ) from None
                provenance["client"] = {
                    "run_nonce": client.run_nonce,
                    "requests_per_s": round(client.requests_per_s, 3),
                    "tokens_per_s": round(client.tokens_per_s, 1),
                    "requests": client.requests_done,
                    "output_tokens": client.tokens_done,
                    "elapsed_s": round(client.elapsed_s, 3),
                    **client.load_facts(),
                }
        failures = FailureCount()
        writer.write(failures.count(assemble(prompt_rows(), builder, journalled_result(journal))))
    share = failures.failed / failures.attempted if failures.attempted else 0.0
    if share > max_failed_share:
        raise TooManyFailures(
            f"{category}: {failures.failed} of {failures.attempted} rows failed ({share:.1%} > max_failed_share "
            f"{max_failed_share:.1%}); the journal {journal.path} keeps the finished rows, and a rerun sends only "
            f"the failed ones. First failures: {'; '.join(failures.examples)}"
        )
    return provenance


# The prompts table's columns a generations row is made of.
ASSEMBLE_COLUMNS = [
    "id",
    "sample_index",
    "category",
    "messages",
    "tools",
    "turn_ends",
    "prompt_ids",
    "seed",
    "max_new_tokens",
    "status",
    "reason",
]


@contextmanager
def sending_job(journal_file: Path, server_log: Path, output: Path):
    """What a job that sends a journal's requests holds for its whole run (generate, the pilot):
    its attempt's own logs, the journal's lock, and its output table, yielded as (the attempt's
    server log, the writer). The journal is opened inside: opening it may cut a torn tail, which
    only its one writer, the lock's holder, may do."""
    with (
        attempt_logs(Path(server_log)) as attempt_server_log,
        ShardLock(journal_file),
        TableWriter(output, GENERATIONS_SCHEMA) as writer,
    ):
        yield attempt_server_log, writer


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
    budget: dict,
    client: dict,
    max_failed_share: float,
    cache_dir: str,
    shards: int,
    may_send: bool = True,
) -> None:
    """Generate one shard of a category into `shard_generations` (`may_send=False`: only from the
    journal, on a host without the server: rule generate_cached).

    Memory follows the requests in flight and one batch of rows, not the rows done: prompts are
    read a batch at a time, results are read back from the journal as the table is written."""
    params = {
        "model": model,
        "sampling": sampling,
        "engine": engine,
        "budget": budget,
        "client": client,
        "max_failed_share": max_failed_share,
        "cache_dir": cache_dir,
        "shards": shards,
    }
    facts = read_provenance(prompts)
    label = category if shards == 1 else f"{category}[{shard}/{shards}]"

    def prompt_rows():
        return shard_rows(iter_rows(prompts, columns=ASSEMBLE_COLUMNS), shard, shards)

    with sending_job(journal_path(cache_dir, category, shard, shards), server_log, shard_generations) as (
        attempt_server_log,
        writer,
    ):
        journal = open_journal(cache_dir, category, shard, shards)
        provenance = generate_category(
            prompt_rows,
            facts=facts,
            profile=ModelProfile.from_config(model),
            sampling=sampling,
            engine=engine,
            budget=budget,
            client_settings=ClientSettings.from_config(client),
            journal=journal,
            server_log=attempt_server_log,
            max_failed_share=max_failed_share,
            category=label,
            writer=writer,
            may_send=may_send,
        )
        provenance.update(
            {"prompts": facts, "params": params, "config_sha256": stable_hash(params), "shard": shard, "shards": shards}
        )
        writer.close(provenance)
    log.info("%s: wrote %d rows to %s", label, writer.rows, shard_generations)


class _ShardRows:
    """A shard's rows as Arrow record batches, handed out in runs of consecutive rows."""

    def __init__(self, path: Path, batching: Batching):
        self.path = path
        self._batches = iter_record_batches(path, batching)
        self._batch: pa.RecordBatch | None = None
        self._pos = 0

    def take(self, n: int) -> list[pa.RecordBatch]:
        pieces = []
        while n:
            if self._batch is None or self._pos == self._batch.num_rows:
                self._batch, self._pos = next(self._batches, None), 0
                if self._batch is None:
                    raise RuntimeError(f"{self.path} ends before the prompts table does")
            k = min(n, self._batch.num_rows - self._pos)
            pieces.append(self._batch.slice(self._pos, k))
            self._pos += k
            n -= k
        return pieces


def rows_of(prompt_row: dict) -> int:
    """Generations rows of a prompts row: one per turn of its conversation (a row that could not be
    read as a conversation has no turns: one)."""
    return len(prompt_row["turn_ends"] or [0])


def merge_shards(*, prompts: Path, shard_generations: list[Path], generations: Path, batch: dict | None = None) -> None:
    """Join a category's generate shards into one generations table, in prompt order.

    Each shard holds its rows in prompt order, so the merge walks the prompts table once and takes
    each run of rows from its shard, as Arrow slices (no id is converted to Python): a batch per
    shard in memory, whatever the category's size."""
    batching = Batching.from_config(batch)
    shards = len(shard_generations)
    provenance = [read_provenance(path) for path in shard_generations]
    for n, p in enumerate(provenance):
        if p.get("shard", n) != n or p.get("shards", shards) != shards:
            raise RuntimeError(
                f"{shard_generations[n]} holds shard {p.get('shard')} of {p.get('shards')}, not {n} of {shards}"
            )
    held = sum(count_rows(path) for path in shard_generations)
    expected = sum(
        sum(rows_of(k) for k in keys) for keys in iter_batches(prompts, batching, columns=["status", "turn_ends"])
    )
    if held != expected:
        raise RuntimeError(f"{generations}: the shards hold {held} rows, the prompts table's turns {expected}")
    sources = [_ShardRows(path, batching) for path in shard_generations]
    merged = dict(provenance[0])
    merged["shards"] = provenance
    with TableWriter(generations, GENERATIONS_SCHEMA, batching) as writer:
        for keys in iter_batches(prompts, batching, columns=["id", "sample_index", "status", "turn_ends"]):
            owners = [(shard_of(k["id"], shards) if shards > 1 else 0, rows_of(k)) for k in keys]
            pieces = []
            for shard, run in itertools.groupby(owners, key=lambda o: o[0]):
                pieces += sources[shard].take(sum(n for _, n in run))
            table = pa.Table.from_batches(pieces)
            got = zip(table.column("id").to_pylist(), table.column("sample_index").to_pylist())
            expected_keys = ((k["id"], k["sample_index"]) for k in keys for _ in range(rows_of(k)))
            for k, (row_id, sample) in zip(expected_keys, got):
                if (row_id, sample) != k:
                    raise RuntimeError(
                        f"{generations}: prompt row {k[0]}.{k[1]} meets shard row "
                        f"{row_id}.{sample}: the shards are not in prompt order"
                    )
            writer.write_arrow(table)
        writer.close(merged)
    log.info("merged %d shards, %d rows into %s", shards, writer.rows, generations)
