"""What a shard sends, known before any server starts: the request fingerprints (what identifies a
generation, so that the journal doubles as a cache), the shard a row belongs to, its journal, and
the plan (rows to send, rows already generated, rows skipped). Used by the plan_generation step on
the CPU, and by the generate and pilot steps that send what it finds.
"""

import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.turns import TurnBuilder, walk
from eagle3_datagen.settings import Budget, ModelProfile
from eagle3_datagen.storage.layout import journal_path

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """How many rows of a shard need the server, and how many are already done or skipped.

    Counts only: the requests themselves are made again, lazily, when they are sent
    (`requests_to_send`), so a plan of any size takes no memory."""

    to_send: int = 0
    reused: int = 0
    reused_output_tokens: int = 0
    skipped: int = 0
    prompt_tokens_to_send: int = 0
    max_new_tokens_to_send: int = 0
    # Turns after the ones to send: a later turn's prompt holds the answer to the turn before, so
    # it is known only once that answer is; each is at most one more request.
    later_turns: int = 0
    # Turns that a conversation's journalled answers already ended (a cut answer, a tool mismatch).
    ended_turns: int = 0
    # Per serving mode: [turns to send, their max_new_tokens] (each mode has its own budget).
    by_mode: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The cost preview: what a run would send, and what it already has (counted in turns)."""
        by_mode = {mode: {"to_send": n, "max_new_tokens_to_send": t} for mode, (n, t) in self.by_mode.items()}
        return asdict(self) | {"by_mode": by_mode}


# The prompts table's columns that planning and sending read (not the messages).
PLAN_COLUMNS = [
    "id",
    "sample_index",
    "mode",
    "prompt_ids",
    "max_new_tokens",
    "seed",
    "status",
    "messages",
    "tools",
    "turn_ends",
]


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


def make_template(facts: dict, profile: ModelProfile, sampling: dict, engine: EngineSettings) -> RequestTemplate:
    """The request parts shared by every row, from the token facts of the prompts table."""
    # What identifies the server's model, known before any server starts. Nothing can be read from
    # an external server before the run: model.name (in the fingerprint) names what it serves.
    server = engine.fingerprint()
    if engine.server.weights_dir is not None:
        server["weights"] = model_dir_fingerprint(engine.server.weights_dir)
    fingerprint = {
        "model": profile.name,
        "tokenizer_sha256": facts["tokenizer_sha256"],
        "chat_template_sha256": facts["chat_template_sha256"],
        "vocab_size": facts["vocab_size"],
        "chat_template_kwargs": profile.chat_template_kwargs,
        "sglang_version": profile.sglang_version,
        "server": server,
    }
    return RequestTemplate(
        sampling=dict(sampling),
        stop_token_ids=list(facts["stop_token_ids"]),
        vocab_size=int(facts["vocab_size"]),
        model_fingerprint=fingerprint,
    )


def mode_sampling(sampling: dict, profile: ModelProfile) -> dict[str, dict]:
    """{mode: sampling values}: the `sampling` param is per mode (`sampling.sampling_for`); one flat
    set of values applies to every mode."""
    if sampling and all(isinstance(v, dict) for v in sampling.values()):
        missing = [m for m in profile.mode_names if m not in sampling]
        if missing:
            raise ValueError(f"no sampling values for mode(s) {', '.join(missing)} of model {profile.name!r}")
        return {m: dict(sampling[m]) for m in profile.mode_names}
    return {m: dict(sampling) for m in profile.mode_names}


def make_builder(
    facts: dict, profile: ModelProfile, sampling: dict, engine: EngineSettings | dict, budget: dict
) -> TurnBuilder:
    """The requests of a category's conversations (`turns.TurnBuilder`), from its prompts table's facts,
    each mode's with its own template variables and sampling; `budget` (max_new_tokens, min_new_tokens,
    reserve_tokens) sizes the later turns' answers."""
    per_mode = mode_sampling(sampling, profile)
    engine = EngineSettings.of(engine)  # once, for every mode's template
    templates = {m: make_template(facts, profile.for_mode(m), per_mode[m], engine) for m in profile.mode_names}
    return TurnBuilder(
        templates[profile.mode],
        profile,
        Budget(**budget),
        tokenizer_sha256=facts.get("tokenizer_sha256"),
        templates=templates,
        tool_divergence=facts.get("tool_divergence", "end"),
    )


def journalled(journal: Journal | None):
    """The reusable (ok) result of a request, from the journal."""
    return (lambda req: journal.reusable(req.fingerprint)) if journal is not None else (lambda req: None)


def make_plan(rows: Iterable[dict], builder: TurnBuilder, journal: Journal | None) -> Plan:
    """Walk each conversation through the journal: its journalled turns are reused, the first turn
    without an answer is sent, the turns after it are `later_turns`."""
    result = Plan()
    reusable = journalled(journal)
    for row in rows:
        if row["status"] != "ok":
            result.skipped += len(row["turn_ends"] or [0])  # every turn of a skipped conversation
            continue
        conversation = builder.start(row)
        for step in walk(conversation, reusable):
            if step.result is not None:
                result.reused += 1
                result.reused_output_tokens += len(step.result.get("output_ids") or ())
                continue
            result.to_send += 1
            result.prompt_tokens_to_send += len(step.request.prompt_ids)
            result.max_new_tokens_to_send += step.request.max_new_tokens
            mode = result.by_mode.setdefault(step.request.mode, [0, 0])
            mode[0], mode[1] = mode[0] + 1, mode[1] + step.request.max_new_tokens
            result.later_turns += conversation.turns - step.request.turn - 1
        if conversation.end_reason is not None:
            result.ended_turns += conversation.turns - conversation.turn - 1
    return result


def requests_to_send(
    rows: Iterable[dict], builder: TurnBuilder, journal: Journal | None, in_flight: dict | None = None
) -> Iterator[Request]:
    """The requests a plan sends, made as they are drawn: each conversation's first turn without a
    journalled answer. `in_flight` gets each request's conversation, by request key, so that the
    answer's follow-up can make the next turn."""
    reusable = journalled(journal)
    for row in rows:
        if row["status"] != "ok":
            continue
        conversation = builder.start(row)
        for step in walk(conversation, reusable):
            if step.result is None:
                if in_flight is not None:
                    in_flight[step.request.key] = conversation
                yield step.request


def shard_of(row_id: str, shards: int) -> int:
    """The shard a row belongs to: stable, so adding prompts moves no existing row."""
    return int(hashlib.sha256(row_id.encode("utf-8")).hexdigest()[:12], 16) % shards


def shard_rows(prompt_rows: Iterable[dict], shard: int, shards: int) -> Iterator[dict]:
    return (r for r in prompt_rows if shards == 1 or shard_of(r["id"], shards) == shard)


def open_journal(cache_dir: str | Path, category: str, shard: int, shards: int, *, read_only: bool = False) -> Journal:
    """The shard's journal, reusing what every journal of the category holds (shard counts may change)."""
    path = journal_path(cache_dir, category, shard, shards)
    others = sorted(path.parent.glob("*.jsonl")) if path.parent.exists() else []
    return Journal(path, read_only=read_only, also_read=others)
