"""Reason codes of a generated row, from its ids: what the quality gate flags and why.

`CODES`, in order: `repetition_loop` (`loops.find_loop`, or the client stopped it live as one),
`unfinished_reasoning` (cut by its budget inside its reasoning), `stopped_in_reasoning` (ended on a
stop id inside it), `empty_answer` (only whitespace after the reasoning) and `unexpected_stop` (a
stop id that is no turn end of `model.stop_tokens`); docs/quality.md says what each means and why.

Every decision reads token ids and the tokenizer's facts (`QualityFacts`, from the prompts table's
provenance or, for `audit`, from the tokenizer); nothing is decoded to text and re-tokenized.
"""

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from eagle3_datagen.quality.loops import LoopSettings, find_loop
from eagle3_datagen.settings import defaults

CODES = ("repetition_loop", "unfinished_reasoning", "stopped_in_reasoning", "empty_answer", "unexpected_stop")
# Where the generation prompt sits: a reasoning opener or closer further back belongs to the history.
PROMPT_TAIL = 64
# finish_type of an answer the client stopped as a loop while it was generated.
LOOP_FINISH = "loop"


@dataclass(frozen=True)
class QualityFacts:
    """The ids the flags are read against."""

    turn_end_ids: frozenset  # model.stop_tokens: how a turn ends
    stop_ids: frozenset  # every id the server stops on (turn ends, model.eos_tokens, the model files' eos)
    reasoning_start_id: int | None = None
    reasoning_end_id: int | None = None
    whitespace_ids: frozenset = frozenset()  # ids whose text is whitespace only

    @classmethod
    def from_token_facts(cls, facts: dict) -> "QualityFacts":
        """From `tokens.token_facts.token_facts` (the prompts table's provenance)."""
        # Tables written before turn ends and eos were told apart sent the turn ends alone.
        turn_ends = frozenset(facts.get("turn_end_ids", facts.get("stop_token_ids")) or ())
        stop_set = facts.get("stop_set") or {}
        return cls(
            turn_end_ids=turn_ends,
            stop_ids=frozenset(stop_set.get("ids") or ()) | turn_ends,
            reasoning_start_id=facts.get("reasoning_start_id"),
            reasoning_end_id=facts.get("reasoning_end_id"),
            whitespace_ids=frozenset(facts.get("whitespace_ids") or ()),
        )


@dataclass(frozen=True)
class Flag:
    code: str
    detail: str


@dataclass(frozen=True)
class QualitySettings:
    """Config `quality`: a policy per code, the loop detector, and the live stop."""

    policies: dict = field(default_factory=lambda: dict.fromkeys(CODES, "quarantine"))
    loop: LoopSettings = LoopSettings()
    live_stop: bool = True
    stream_interval: int = 32

    @classmethod
    def from_config(cls, quality: dict | None = None) -> "QualitySettings":
        q = defaults("quality", **(quality or {}))
        return cls(
            policies={code: q["policies"][code] for code in CODES},
            loop=LoopSettings(**q["loop"]),
            live_stop=bool(q["live_stop"]),
            stream_interval=int(q["stream_interval"]),
        )

    @property
    def stops_loops_live(self) -> bool:
        """The client stops loops while they are generated only where a loop would be quarantined:
        with `keep`, the user wants the whole of what the model wrote."""
        return self.live_stop and self.policies["repetition_loop"] == "quarantine"

    def quarantined(self, flags: Iterable[Flag]) -> Flag | None:
        """The first flag (in `CODES` order) whose policy is quarantine, or None: the row is kept."""
        return next((flag for flag in flags if self.policies.get(flag.code) == "quarantine"), None)

    to_json = dataclasses.asdict


def _reasoning_open_at_start(prompt_ids, facts: QualityFacts) -> bool:
    """Whether the generation prompt left the reasoning open (its last opener after its last closer)."""
    for tid in reversed(prompt_ids[-PROMPT_TAIL:]):
        if tid in (facts.reasoning_start_id, facts.reasoning_end_id):
            return tid != facts.reasoning_end_id
    return False


def _reasoning_state(prompt_ids, output_ids, facts: QualityFacts) -> tuple[bool, int | None]:
    """(whether the output ends inside its reasoning, the index of its last reasoning end or None)."""
    # From the end back to the last closer only: the answer, not a long reasoning before it.
    last_end = next((i for i in range(len(output_ids) - 1, -1, -1) if output_ids[i] == facts.reasoning_end_id), None)
    # Closed, unless the output opened it again after its last closer.
    reopened = facts.reasoning_start_id in (output_ids if last_end is None else output_ids[last_end + 1 :])
    return reopened or (last_end is None and _reasoning_open_at_start(prompt_ids, facts)), last_end


def _empty_answer(output_ids: list, last_end: int | None, body_end: int, facts: QualityFacts) -> str | None:
    """What makes a stopped answer empty (its answer part, after the reasoning's end where the
    output closes it, else the whole output, is whitespace only), or None."""
    after = output_ids[0 if last_end is None else last_end + 1 : body_end]
    if not all(t in facts.whitespace_ids for t in after):
        return None
    what = f"only {len(after)} whitespace tokens" if after else "nothing"
    if last_end is None:
        return f"{what} before the stop (no reasoning in the output: the answer itself is empty)"
    return f"the reasoning closed at output token {last_end}, then {what} before the stop"


def row_flags(prompt_ids, output_ids, finish_type: str, facts: QualityFacts, loop: LoopSettings) -> list[Flag]:
    """The row's flags, in `CODES` order (empty: nothing to say against it)."""
    flags: list[Flag] = []
    output_ids = list(output_ids)
    n = len(output_ids)
    stopped = finish_type == "stop" and n > 0 and output_ids[-1] in facts.stop_ids
    body_end = n - 1 if stopped else n

    if finish_type == LOOP_FINISH:
        found = find_loop(output_ids, loop)
        detail = found.describe() if found else f"stopped as a loop while generated, after {n} tokens"
        flags.append(Flag("repetition_loop", f"{detail}; stopped while generated"))
    else:
        found = find_loop(output_ids, loop, end=body_end, at_budget=finish_type == "length")
        if found is not None:
            flags.append(Flag("repetition_loop", found.describe()))

    open_at_end, last_end = False, None
    inside = f"after {n} tokens inside the reasoning (no reasoning end)"
    if facts.reasoning_end_id is not None:
        open_at_end, last_end = _reasoning_state(prompt_ids, output_ids, facts)
        if finish_type in ("length", LOOP_FINISH) and open_at_end:
            cut = "its budget" if finish_type == "length" else "the loop stop"
            flags.append(Flag("unfinished_reasoning", f"ended by {cut} {inside}"))
    if stopped and open_at_end:
        flags.append(Flag("stopped_in_reasoning", f"stopped on id {output_ids[-1]} {inside}"))
    if stopped and not open_at_end:
        empty = _empty_answer(output_ids, last_end, body_end, facts)
        if empty is not None:
            flags.append(Flag("empty_answer", empty))

    if finish_type == "stop" and n > 0 and output_ids[-1] not in facts.turn_end_ids:
        detail = f"stopped on id {output_ids[-1]}, which stops generation but is not a turn end of model.stop_tokens"
        flags.append(Flag("unexpected_stop", f"{detail} {sorted(facts.turn_end_ids)}"))
    return flags
