"""A shard's generations rows: assembled from the journal in prompt order (`assemble`), counted
(`FailureCount`), written (`sending_job`), and handed out in runs for merging the shards (`ShardRows`).
Imports `storage` and this layer's `journal`, `locks`, `requests`, `servers` and `turns`.
"""

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.locks import ShardLock
from eagle3_datagen.generation.requests import Request, row_label
from eagle3_datagen.generation.servers import attempt_logs
from eagle3_datagen.generation.turns import TurnBuilder, walk
from eagle3_datagen.settings import DEFAULT_MODE
from eagle3_datagen.storage.prompts import without_source
from eagle3_datagen.storage.tables import GENERATIONS_SCHEMA, Batching, TableWriter, iter_record_batches

# The prompts table's columns a generations row is made of.
ASSEMBLE_COLUMNS = (
    "id sample_index mode category messages tools turn_ends prompt_ids seed max_new_tokens status reason".split()
)


def rows_of(prompt_row: dict) -> int:
    """Generations rows of a prompts row: one per turn of its conversation (at least one)."""
    return len(prompt_row["turn_ends"] or [0])


def assemble(
    prompt_rows: Iterable[dict], builder: TurnBuilder, result_of: Callable[[Request], dict | None]
) -> Iterator[dict]:
    """The generations rows of the prompt rows, in prompt order: one per turn of each conversation, and
    a skipped row with the reason for each turn not sent. `result_of(request)`: its journalled result."""
    sampling = {mode: json.dumps(t.sampling, sort_keys=True) for mode, t in builder.templates.items()}
    for p in prompt_rows:
        mode = builder.mode_of(p)
        base = {
            "id": p["id"],
            "sample_index": p["sample_index"],
            "mode": mode,
            "category": p["category"],
            "tools": p.get("tools") or "",
            "sampling": sampling[mode],
        }
        if p["status"] != "ok":
            prompt = {k: p[k] for k in ("messages", "prompt_ids", "seed", "max_new_tokens")}
            yield _unsent(base, 0, p["status"], p["reason"], **prompt)
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
                "messages": json.dumps(conversation.history, ensure_ascii=False),
                "history": conversation.history_kind,
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
                "resumed_at": r.get("resumed_at", []),
                "status": r["status"],
                "error": r.get("error", ""),
            }
        yield from _unreached_turns(base, conversation.turn + 1, conversation.turns, conversation.end_reason)


def _unreached_turns(base: dict, first: int, turns: int, why: str | None) -> Iterator[dict]:
    """Skipped rows for the turns `first`..`turns - 1` that a conversation did not reach, and why it ended."""
    for turn in range(first, turns):
        yield _unsent(base, turn, "skipped", f"conversation ended: {why}")


def _unsent(base: dict, turn: int, status: str, error: str, **prompt) -> dict:
    """A row that was never sent: what there is of its `prompt`, and no answer."""
    none = {"messages": "", "prompt_ids": [], "seed": 0, "max_new_tokens": 0}
    return {**base, "turn": turn, **none, **prompt, "output_ids": [], "status": status, "error": error, "attempts": 0}


def journalled_result(journal: Journal) -> Callable[[Request], dict | None]:
    """A request's result: the ok entry made by exactly this request, else what was journalled for its row."""
    return lambda req: journal.reusable(req.fingerprint) or journal.entry(req.key)


class FailureCount:
    """Attempted and failed rows of a shard, counted as they are written."""

    def __init__(self):
        self.attempted = self.failed = 0
        self.examples: list[str] = []

    def count(self, rows: Iterable[dict]) -> Iterator[dict]:
        for r in rows:
            self.attempted += r["status"] in ("ok", "failed")
            if r["status"] == "failed":
                self.failed += 1
                if len(self.examples) < 5:
                    label = row_label(r["id"], r["sample_index"], r["turn"], r.get("mode", DEFAULT_MODE))
                    self.examples.append(f"{label}: {r['error']}")
            yield r


@contextmanager
def sending_job(journal_file: Path, server_log: Path, output: Path):
    """What a job that sends a journal's requests holds for its whole run: its attempt's logs, the journal's
    lock, and its output table (yields the attempt's server log and the writer)."""
    with (
        attempt_logs(Path(server_log)) as attempt_server_log,
        ShardLock(journal_file),
        TableWriter(output, GENERATIONS_SCHEMA) as writer,
    ):
        yield attempt_server_log, writer


class ShardRows:
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
