"""check_sequences: raw-token invariants of every generated row; any violation stops the export."""

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from eagle3_datagen.generation.turns import ORIGINAL, call_names
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.storage.tables import Batching, count_rows, iter_batches, logged
from eagle3_datagen.tokens.templating import ChatTokenizer
from eagle3_datagen.tokens.token_facts import stop_set
from eagle3_datagen.tokens.vocabulary import load_tokenizer, token_ids

log = logging.getLogger(__name__)


class SequenceViolation(RuntimeError):
    pass


RULES = {
    "prompt_matches_template": "prompt_ids equal a fresh apply_chat_template of the row's messages",
    "prompt_suffix": "the prompt ends with the model profile's prompt_suffix",
    "no_prompt_only_tokens": "no output contains a prompt-only token",
    "ends_with_stop": "an ok row ends with an id the server stops on (a stop token or the model's eos) unless finish_type is length or loop (stopped as a repetition loop while generated)",
    "finish_matches_output": "a stop finish's matched token is the last output token",
    "ids_in_vocabulary": "every id lies inside the vocabulary",
    "within_budget": "no output is longer than the row's max_new_tokens",
    "history_holds_answers": (
        "a later turn's history is the turn before's history, then the model's answer to it as the chat layer parses it"
    ),
}


@dataclass
class SequenceReport:
    """Counts of every violation, and the first `EXAMPLES` of them with their rows."""

    EXAMPLES = 200

    checked: int = 0
    violations: list[dict] = field(default_factory=list)
    total: Counter = field(default_factory=Counter)

    def add(self, row: dict, rule: str, detail: str) -> None:
        self.total[rule] += 1
        if len(self.violations) < self.EXAMPLES:
            self.violations.append(
                {
                    "id": row["id"],
                    "sample_index": int(row["sample_index"]),
                    "turn": int(row.get("turn", 0)),
                    "mode": row.get("mode", ""),
                    "rule": rule,
                    "detail": detail,
                }
            )

    @property
    def n_violations(self) -> int:
        return sum(self.total.values())

    def to_json(self) -> dict:
        counts = {rule: self.total.get(rule, 0) for rule in RULES}
        return {"checked": self.checked, "violations": counts, "rules": RULES, "examples": self.violations}

    def message(self, limit: int = 20) -> str:
        lines = [f"{self.n_violations} sequence violations in {self.checked} rows:"]
        lines += [
            f"  {v['id']}.{v['sample_index']} turn {v['turn']} ({v['mode']}): {v['rule']} ({RULES[v['rule']]}): {v['detail']}"
            for v in self.violations[:limit]
        ]
        if self.n_violations > limit:
            lines.append(f"  ... and {self.n_violations - limit} more (see the report file)")
        return "\n".join(lines)


class _Mode:
    """What the rules know of one serving mode: its template render, prompt suffix, prompt-only ids."""

    def __init__(self, tokenizer, profile: ModelProfile):
        self.profile = profile
        self.suffix = token_ids(tokenizer, profile.prompt_suffix)
        self.prompt_only = set(token_ids(tokenizer, profile.prompt_only_tokens))
        self.chat = ChatTokenizer(tokenizer, profile)

    @cached_property
    def layer(self):
        """The chat layer, for later turns only: what it parses an answer into."""
        from eagle3_datagen.tokens.chat_layer import ChatLayer

        return ChatLayer(self.chat.tokenizer, self.profile)


class SequenceChecker:
    """The raw-token rules, set up once per category and applied a batch at a time; each row is
    checked against its own serving mode (its template variables, suffix and prompt-only tokens)."""

    def __init__(self, tokenizer, profile: ModelProfile):
        self.vocab = len(tokenizer)
        self.stops = set(stop_set(tokenizer, profile).ids)
        self.tokenizer, self.profile = tokenizer, profile
        self._modes: dict[str, _Mode] = {}
        self._before: dict | None = None  # the last ok row: a later turn's history starts from it

    def mode(self, row: dict) -> _Mode:
        name = row.get("mode") or self.profile.mode
        if name not in self._modes:
            self._modes[name] = _Mode(self.tokenizer, self.profile.for_mode(name))
        return self._modes[name]

    def _history_problem(self, g: dict) -> str | None:
        """Why a later turn's history is not the turn before's history and its answer, or None."""
        before, self._before = self._before, g
        if not g.get("turn"):
            return None
        key = (g["id"], g["sample_index"], g.get("mode"), int(g["turn"]) - 1)
        if before is None or (before["id"], before["sample_index"], before.get("mode"), int(before["turn"])) != key:
            return "the turn before is not an ok row just before this one"
        earlier = json.loads(before["messages"])
        history = json.loads(g["messages"])
        tools = json.loads(g["tools"]) if g["tools"] else None
        answer = self.mode(g).layer.answer_message(before["output_ids"], before["finish_type"], tools, earlier)
        found = history[len(earlier)] if len(history) > len(earlier) else None
        # Where the model's tool calls diverged from the original's, the original message stands in
        # its place (tool_divergence: original): then, and only then, the calls differ.
        diverged = (
            g.get("history") == ORIGINAL
            and (found or {}).get("role") == "assistant"
            and call_names(found.get("tool_calls") or []) != call_names(answer.get("tool_calls") or [])
        )
        if history[: len(earlier)] != earlier:
            return "the history does not start with the turn before's history"
        if found != answer and not diverged:
            return (
                f"the answer in the history {json.dumps(found)[:200]} is not the chat layer's message of the turn "
                f"before's output {json.dumps(answer)[:200]}"
            )
        return None

    def check(self, generations: list[dict], report: SequenceReport) -> None:
        """Check every ok row of a batch; each row carries the messages and tools of its prompt (for a
        later turn: the history with the model's own earlier answers)."""
        ok_rows = [g for g in generations if g["status"] == "ok"]
        report.checked += len(ok_rows)
        for g, fresh_ids in zip(ok_rows, self._fresh_prompt_ids(ok_rows)):
            if (problem := self._history_problem(g)) is not None:
                report.add(g, "history_holds_answers", problem)
            for rule, detail in self._violations(g, fresh_ids):
                report.add(g, rule, detail)

    def _violations(self, g: dict, fresh_ids: list[int]) -> Iterator[tuple[str, str]]:
        """(rule, detail) of each raw-token rule an ok row breaks, but the history's."""
        mode, stops, vocab = self.mode(g), self.stops, self.vocab
        prompt_ids, output_ids, finish, suffix = g["prompt_ids"], g["output_ids"], g["finish_type"], mode.suffix
        if prompt_ids != fresh_ids:
            n = min(len(prompt_ids), len(fresh_ids))
            pos = next((i for i, (a, b) in enumerate(zip(prompt_ids, fresh_ids)) if a != b), n)
            stored, fresh = prompt_ids[pos : pos + 5], fresh_ids[pos : pos + 5]
            yield "prompt_matches_template", f"first difference at position {pos}: stored {stored} vs fresh {fresh}"
        if suffix and prompt_ids[-len(suffix) :] != suffix:
            expected = f"expected mode {mode.profile.mode}'s suffix {suffix}"
            yield "prompt_suffix", f"prompt ends {prompt_ids[-len(suffix) - 2 :]}, {expected}"
        if not mode.prompt_only.isdisjoint(output_ids):
            bad_outputs = sorted(mode.prompt_only.intersection(output_ids))
            yield "no_prompt_only_tokens", f"output contains prompt-only ids {bad_outputs}"
        if finish not in ("length", LOOP_FINISH) and (not output_ids or output_ids[-1] not in stops):
            last = output_ids[-1:] or None
            yield "ends_with_stop", f"finish_type {finish!r}, last output id {last}, stop ids {sorted(stops)}"
        matched = g["finish_matched"]
        if finish == "stop" and matched.lstrip("-").isdigit() and output_ids and int(matched) != output_ids[-1]:
            yield "finish_matches_output", f"matched {matched} but last output id {output_ids[-1]}"
        ids = prompt_ids + output_ids
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            outside = sorted({t for t in ids if not 0 <= t < vocab})
            yield "ids_in_vocabulary", f"ids {outside[:10]} outside vocabulary of {vocab}"
        if len(output_ids) > int(g["max_new_tokens"]):
            yield "within_budget", f"{len(output_ids)} output tokens > max_new_tokens {g['max_new_tokens']}"

    def _fresh_prompt_ids(self, prompt_rows: list[dict]) -> list[list[int]]:
        """Each row's messages rendered afresh with its mode's template variables (a batch per mode)."""
        fresh: list[list[int]] = [[] for _ in prompt_rows]
        by_mode: dict[str, list[int]] = {}
        for i, p in enumerate(prompt_rows):
            by_mode.setdefault(self.mode(p).profile.mode, []).append(i)
        for name, indices in by_mode.items():
            rows = [prompt_rows[i] for i in indices]
            conversations = [json.loads(p["messages"]) for p in rows]
            tools = [json.loads(p["tools"]) if p["tools"] else None for p in rows]
            for i, t in zip(indices, self._modes[name].chat.tokenize(conversations, tools)):
                fresh[i] = t.prompt_ids
        return fresh


def check_rows(generations: list[dict], *, tokenizer, profile: ModelProfile) -> SequenceReport:
    """Check every ok row of one batch (see `SequenceChecker`)."""
    report = SequenceReport()
    SequenceChecker(tokenizer, profile).check(generations, report)
    return report


def check_sequences(
    *, generations: Path, sequence_report: Path, model: dict, batch: dict | None = None
) -> SequenceReport:
    """Check one category's generations a batch at a time; any violation fails the job."""
    profile = ModelProfile.from_config(model)
    checker = SequenceChecker(load_tokenizer(profile), profile)
    report = SequenceReport()
    batches = iter_batches(generations, Batching.from_config(batch))
    for gens in logged(batches, count_rows(generations), "check_sequences"):
        checker.check(gens, report)
    if report.n_violations:
        raise SequenceViolation(report.message())
    sequence_report.parent.mkdir(parents=True, exist_ok=True)
    sequence_report.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    log.info("%d rows checked, no violations", report.checked)
    return report
