"""check_sequences: raw-token invariants of every generated row; any violation stops the export."""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .settings import ModelProfile
from .tables import read_rows
from .templating import ChatTokenizer, load_tokenizer, token_ids

log = logging.getLogger(__name__)


class SequenceViolation(RuntimeError):
    pass


RULES = {
    "prompt_matches_template": "prompt_ids equal a fresh apply_chat_template of the row's messages",
    "prompt_suffix": "the prompt ends with the model profile's prompt_suffix",
    "no_prompt_only_tokens": "no output contains a prompt-only token",
    "ends_with_stop": "an ok row ends with a stop token unless finish_type is length",
    "finish_matches_output": "a stop finish's matched token is the last output token",
    "ids_in_vocabulary": "every id lies inside the vocabulary",
    "within_budget": "no output is longer than the row's max_new_tokens",
}


@dataclass
class SequenceReport:
    checked: int = 0
    violations: list[dict] = field(default_factory=list)

    def add(self, row: dict, rule: str, detail: str) -> None:
        self.violations.append(
            {"id": row["id"], "sample_index": int(row["sample_index"]), "rule": rule, "detail": detail}
        )

    def counts(self) -> dict:
        counts = {rule: 0 for rule in RULES}
        for v in self.violations:
            counts[v["rule"]] += 1
        return counts

    def to_json(self) -> dict:
        return {"checked": self.checked, "violations": self.counts(), "rules": RULES, "examples": self.violations[:200]}

    def message(self, limit: int = 20) -> str:
        lines = [f"{len(self.violations)} sequence violations in {self.checked} rows:"]
        for v in self.violations[:limit]:
            lines.append(f"  {v['id']}.{v['sample_index']}: {v['rule']} ({RULES[v['rule']]}): {v['detail']}")
        if len(self.violations) > limit:
            lines.append(f"  ... and {len(self.violations) - limit} more (see the report file)")
        return "\n".join(lines)


def check_rows(generations: list[dict], prompts: list[dict], *, tokenizer, profile: ModelProfile) -> SequenceReport:
    """Check every ok row; prompts (with their messages) come from the tokenize step's table."""
    report = SequenceReport()
    vocab = len(tokenizer)
    suffix = token_ids(tokenizer, profile.prompt_suffix)
    prompt_only = set(token_ids(tokenizer, profile.prompt_only_tokens))
    stops = set(token_ids(tokenizer, profile.stop_tokens))
    ok_rows = [g for g in generations if g["status"] == "ok"]
    report.checked = len(ok_rows)

    # Only usable rows have a unique (id, sample_index); a skipped duplicate may share its id.
    by_key = {(p["id"], int(p["sample_index"])): p for p in prompts if p["status"] == "ok"}
    fresh = _fresh_prompt_ids([by_key[(g["id"], int(g["sample_index"]))] for g in ok_rows], tokenizer, profile)

    for g, fresh_ids in zip(ok_rows, fresh):
        prompt_ids, output_ids = list(g["prompt_ids"]), list(g["output_ids"])
        if prompt_ids != fresh_ids:
            pos = next(
                (i for i, (a, b) in enumerate(zip(prompt_ids, fresh_ids)) if a != b),
                min(len(prompt_ids), len(fresh_ids)),
            )
            report.add(
                g,
                "prompt_matches_template",
                f"first difference at position {pos}: stored {prompt_ids[pos : pos + 5]} vs fresh {fresh_ids[pos : pos + 5]}",
            )
        if suffix and prompt_ids[-len(suffix) :] != suffix:
            report.add(g, "prompt_suffix", f"prompt ends {prompt_ids[-len(suffix) - 2 :]}, expected suffix {suffix}")
        bad_outputs = sorted({t for t in output_ids if t in prompt_only})
        if bad_outputs:
            report.add(g, "no_prompt_only_tokens", f"output contains prompt-only ids {bad_outputs}")
        if g["finish_type"] != "length" and (not output_ids or output_ids[-1] not in stops):
            report.add(
                g,
                "ends_with_stop",
                f"finish_type {g['finish_type']!r}, last output id {output_ids[-1:] or None}, stop ids {sorted(stops)}",
            )
        if (
            g["finish_type"] == "stop"
            and g["finish_matched"].lstrip("-").isdigit()
            and output_ids
            and int(g["finish_matched"]) != output_ids[-1]
        ):
            report.add(g, "finish_matches_output", f"matched {g['finish_matched']} but last output id {output_ids[-1]}")
        outside = sorted({t for t in prompt_ids + output_ids if not 0 <= t < vocab})
        if outside:
            report.add(g, "ids_in_vocabulary", f"ids {outside[:10]} outside vocabulary of {vocab}")
        if len(output_ids) > int(g["max_new_tokens"]):
            report.add(g, "within_budget", f"{len(output_ids)} output tokens > max_new_tokens {g['max_new_tokens']}")
    return report


def _fresh_prompt_ids(prompt_rows: list[dict], tokenizer, profile: ModelProfile) -> list[list[int]]:
    chat = ChatTokenizer(tokenizer, profile)
    conversations = [json.loads(p["messages"]) for p in prompt_rows]
    tools = [json.loads(p["tools"]) if p["tools"] else None for p in prompt_rows]
    return [t.prompt_ids for t in chat.tokenize(conversations, tools)]


def check_sequences(*, generations: Path, prompts: Path, sequence_report: Path, model: dict) -> SequenceReport:
    """Check one category's generations; raises SequenceViolation (the job fails) on any violation."""
    profile = ModelProfile.from_config(model)
    report = check_rows(read_rows(generations), read_rows(prompts), tokenizer=load_tokenizer(profile), profile=profile)
    if report.violations:
        raise SequenceViolation(report.message())
    sequence_report.parent.mkdir(parents=True, exist_ok=True)
    sequence_report.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    log.info("%d rows checked, no violations", report.checked)
    return report
