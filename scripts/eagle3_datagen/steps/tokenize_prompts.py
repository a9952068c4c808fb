"""tokenize_prompts: one category's prompts table — normalized rows, exact prompt ids, budgets, seeds.

Its provenance carries the token facts every later step needs (`token_facts.token_facts`), so that
planning and generation never load the tokenizer. A prompt suffix the template does not render
fails the category on its first prompts, before any GPU time.
"""

import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from eagle3_datagen.generation.turns import turn_ends
from eagle3_datagen.settings import Budget, ModelProfile, ModeMix, stable_hash
from eagle3_datagen.storage.progress import Progress
from eagle3_datagen.storage.prompt_rows import PromptRow, ReadOptions
from eagle3_datagen.storage.prompts import iter_prompts, prompt_extent, without_source
from eagle3_datagen.storage.tables import PROMPTS_SCHEMA, Batching, TableWriter
from eagle3_datagen.tokens.prompt_suffix import SuffixCheck
from eagle3_datagen.tokens.templating import CONTROL_TOKEN_POLICY, ChatTokenizer
from eagle3_datagen.tokens.token_facts import output_budget, token_facts
from eagle3_datagen.tokens.vocabulary import load_tokenizer, token_ids

log = logging.getLogger(__name__)


class BadRows(ValueError):
    """Rows that cannot be used, under `on_bad_rows: fail`."""


class UnexpectedRows(BadRows):
    """More rows skipped by unexpected errors (possibly a bug) than `max_unexpected_row_share` allows."""


def tokenize_prompts(
    *,
    source: Path,
    prompts: Path,
    category: str,
    model: dict,
    budget: dict,
    samples_per_prompt: int,
    seed: int,
    on_bad_rows: str,
    allow_empty: bool = False,
    reading: dict | None = None,
    turns: str = "last",
    batch: dict | None = None,
    max_unexpected_row_share: float = 0.01,
    mode_mix: str | None = None,
    tool_divergence: str = "end",
) -> None:
    """Tokenize one category's prompt file `source` into the prompts table `prompts`, a batch at a time.

    Rows skipped by an unexpected error (`PromptRow.unexpected`: possibly a bug) past
    `max_unexpected_row_share` of the rows fail the category, whatever `on_bad_rows` says."""
    # The step's parameters as given, for the provenance (in signature order).
    params = {k: v for k, v in locals().items() if k not in ("source", "prompts", "category", "batch")}
    profile = ModelProfile.from_config(model)
    mix = ModeMix.parse(mode_mix, profile.mode_names)
    tokenizer = load_tokenizer(profile)
    chats = mode_chats(ChatTokenizer(tokenizer, profile.for_mode(mix.names[0])), profile, mix.names)
    batching = Batching.from_config(batch)
    tally = Tally()
    suffixes = SuffixCheck(tokenizer, profile, mix.names)  # a wrong suffix fails on a mode's first prompts
    extent = prompt_extent(source)  # for the progress lines: the records (or lines) ahead
    progress = Progress("tokenize_prompts", extent.rows)
    progress.start()
    with TableWriter(prompts, PROMPTS_SCHEMA, batching) as writer:
        for rows in input_batches(iter_prompts(source, ReadOptions(**(reading or {}))), batching):
            for row in rows:
                if not row.ok:
                    log.warning("skipped: %s", row.reason)
            table = build_prompt_rows(
                rows,
                chats,
                profile=profile,
                budget=Budget(**budget),
                category=category,
                samples_per_prompt=samples_per_prompt,
                base_seed=seed,
                turns=turns,
                mix=mix,
            )
            suffixes.apply(table)
            tally.add(rows, table)
            writer.write(table)
            progress.advance(len(rows), None if extent.rows is not None else extent.fraction(rows[-1].source))
        suffixes.finish()
        check_bad_rows(tally, source, max_unexpected_row_share, allow_empty, on_bad_rows)
        writer.close(table_provenance(source, tokenizer, profile, tally, params, mix))
    progress.finish()
    usable = tally.rows - tally.skipped
    log.info("%s: %d rows, %d usable, %d prompt tokens", category, tally.rows, usable, tally.prompt_tokens)


def table_provenance(
    source: Path, tokenizer, profile: ModelProfile, tally: "Tally", params: dict, mix: ModeMix
) -> dict:
    """The prompts table's provenance: the token facts later steps read instead of the tokenizer (per
    mode under `modes`), the mode mix and its seed, what normalization changed, the step's parameters."""
    return {
        "prompts_file": str(source),
        **token_facts(tokenizer, profile),
        "modes": {
            mode: {
                "prompt_suffix_ids": token_ids(tokenizer, profile.for_mode(mode).prompt_suffix),
                "prompt_only_ids": token_ids(tokenizer, profile.for_mode(mode).prompt_only_tokens),
                "chat_template_kwargs": profile.for_mode(mode).chat_template_kwargs,
                "conversations": tally.modes[mode],
            }
            for mode in mix.names
        },
        "mode_mix": {"spec": mix.to_json(), "seed": params["seed"]},
        "control_token_policy": CONTROL_TOKEN_POLICY,
        "normalization": tally.normalization,
        "turns": params["turns"],
        "tool_divergence": params["tool_divergence"],
        "max_turns": tally.max_turns,
        "unexpected_rows": tally.unexpected,
        "params": params,
    }


def check_bad_rows(tally: "Tally", source: Path, max_unexpected_row_share: float, allow_empty: bool, on_bad_rows: str):
    """Fail the category on too many unexpected errors, no usable row (unless `allow_empty`), or any
    skipped row under `on_bad_rows: fail`."""
    if tally.unexpected > max_unexpected_row_share * tally.rows:
        raise UnexpectedRows(
            f"{tally.unexpected} of {tally.rows} rows of {source} were skipped by an unexpected error, more than "
            f"max_unexpected_row_share {max_unexpected_row_share}: possibly a bug; each traceback is in the log. "
            "First:\n  " + "\n  ".join(tally.first_unexpected)
        )
    if tally.skipped and tally.skipped == tally.rows and not allow_empty:
        raise BadRows(
            f"{source}: none of its {tally.rows} rows can be used (set allow_empty_categories: true to let a "
            f"category end empty). Rows per reason:\n  "
            + "\n  ".join(f"{n} x {why}" for why, n in tally.reasons.most_common(10))
        )
    if tally.skipped and on_bad_rows == "fail":
        listing = "\n  ".join(tally.first_skipped)
        if tally.skipped > len(tally.first_skipped):
            listing += f"\n  ... and {tally.skipped - len(tally.first_skipped)} more"
        raise BadRows(
            f"{tally.skipped} of {tally.rows} rows of {source} cannot be used (on_bad_rows: fail):\n  {listing}"
        )


class Tally:
    """What a category's batches added up to: rows, skips per reason, normalization counts."""

    FIRST = 50

    def __init__(self):
        self.rows = self.skipped = self.prompt_tokens = self.max_turns = 0
        self.unexpected = 0  # rows skipped by an unexpected error (PromptRow.unexpected), also in `skipped`
        self.reasons: Counter = Counter()
        self.first_skipped: list[str] = []
        self.first_unexpected: list[str] = []
        self.normalization: Counter = Counter()  # what reading the file changed (PromptRow.fixes)
        self.modes: Counter = Counter()  # usable conversations per mode

    def add(self, rows: list[PromptRow], table: list[dict]) -> None:
        self.rows += len(rows)
        for row in rows:
            if row.ok:
                self.normalization.update(row.fixes)
            if row.unexpected:
                self.unexpected += 1
                if len(self.first_unexpected) < 10:
                    self.first_unexpected.append(row.reason)
        # A conversation is skipped when none of its modes can use it (its first sample of each).
        firsts: dict[str, list[dict]] = {}
        for r in table:
            self.prompt_tokens += r["n_prompt_tokens"]
            self.max_turns = max(self.max_turns, len(r["turn_ends"]))
            self.modes[r["mode"]] += r["sample_index"] == 0 and r["status"] == "ok"
            if r["sample_index"] == 0:
                firsts.setdefault(r["source"], []).append(r)
        for requests in firsts.values():
            if all(r["status"] == "skipped" for r in requests):
                self.skipped += 1
                self.reasons[without_source(requests[0]["reason"])[:120]] += 1
                if len(self.first_skipped) < self.FIRST:
                    self.first_skipped.append(requests[0]["reason"])


def input_batches(rows: Iterable[PromptRow], batching: Batching) -> Iterator[list[PromptRow]]:
    """Prompt rows in batches of at most `batching.rows` rows and about `batching.tokens` tokens
    (counted, before tokenizing, as a quarter of the characters)."""
    batch: list[PromptRow] = []
    chars = 0
    for row in rows:
        batch.append(row)
        chars += sum(len(str(m.get("content") or "")) for m in row.messages or ())
        if len(batch) >= batching.rows or chars >= 4 * batching.tokens:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def mode_chats(chat: ChatTokenizer, profile: ModelProfile, modes: tuple[str, ...] = ()) -> dict[str, ChatTokenizer]:
    """A chat tokenizer per mode (`modes`, default: every mode of the profile), sharing one tokenizer;
    `chat` serves its own mode."""
    return {
        mode: chat if mode == chat.profile.mode else ChatTokenizer(chat.tokenizer, profile.for_mode(mode))
        for mode in modes or profile.mode_names
    }


def build_prompt_rows(
    rows: list[PromptRow],
    chat: ChatTokenizer | dict[str, ChatTokenizer],
    *,
    profile: ModelProfile,
    budget: Budget,
    category: str,
    samples_per_prompt: int = 1,
    base_seed: int = 0,
    turns: str = "last",
    mix: ModeMix | None = None,
) -> list[dict]:
    """Prompt table rows: one per (id, mode, sample_index), rendered in its modes (`mix`, default: the
    profile's first); skipped rows keep their reason. `prompt_ids` are the first regenerated turn's
    prompt (`turn_ends`: `turns: last` the whole conversation, `turns: all` up to the first answer)."""
    chats = chat if isinstance(chat, dict) else mode_chats(chat, profile)
    mix = mix or ModeMix.parse(None, profile.mode_names)
    ends = {id(r): turn_ends(r.messages, turns) for r in rows if r.ok}
    for r in rows:  # an empty message in the first turn's history: no turn can be made
        if r.ok and r.empty is not None and r.empty[0] < ends[id(r)][0]:
            r.reason = f"{r.source}: field '{r.empty[1]}': empty content"
    usable = [r for r in rows if r.ok]
    modes_of = {id(r): mix.of(base_seed, r.id) for r in rows}
    by_key = {}
    for mode in mix.names:
        in_mode = [r for r in usable if mode in modes_of[id(r)]]
        tokenized = chats[mode].tokenize([r.messages[: ends[id(r)][0]] for r in in_mode], [r.tools for r in in_mode])
        by_key.update(zip(((id(r), mode) for r in in_mode), tokenized))
    out = []
    for row in rows:
        # Key order is kept as given: templates render `tools | tojson` and dict arguments as they are.
        messages_json = json.dumps(row.messages, ensure_ascii=False)
        tools_json = json.dumps(row.tools, ensure_ascii=False) if row.tools else ""
        content_sha256 = stable_hash([row.messages, row.tools])
        for mode in modes_of[id(row)]:
            tokens = by_key.get((id(row), mode))
            prompt_ids = tokens.prompt_ids if tokens is not None else []
            reason, max_new = row.reason, 0
            if reason is None and tokens.error is not None:
                reason = f"{row.source}: field 'messages': the chat template cannot render or encode it: {tokens.error}"
            elif reason is None:
                n, own = len(prompt_ids), budget.for_mode(mode)
                max_new, why = output_budget(n, context_length=profile.context_length, budget=own)
                reason = None if why is None else f"{row.source}: {why}"
            for sample_index in range(samples_per_prompt):
                out.append(
                    {
                        "id": row.id,
                        "sample_index": sample_index,
                        "mode": mode,
                        "category": category,
                        "source": row.source,
                        "messages": messages_json,
                        "tools": tools_json,
                        "messages_sha256": content_sha256,
                        "prompt_ids": prompt_ids,
                        # Kept for a conversation skipped before its first turn too: each turn is a row.
                        "turn_ends": ends.get(id(row), []),
                        "n_prompt_tokens": len(prompt_ids),
                        "max_new_tokens": max_new,
                        # Stable per row and sample, the same in every mode: a mode is what differs.
                        "seed": int(stable_hash([base_seed, row.id, sample_index])[:15], 16) % (2**31 - 1),
                        "status": "ok" if reason is None else "skipped",
                        "reason": reason or "",
                    }
                )
    return out
