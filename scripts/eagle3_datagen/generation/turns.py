"""The turns of a conversation: every assistant turn regenerated on the model's own earlier answers.

With `turns: all`, a conversation with user (or tool) messages u1..un is regenerated turn by turn:
turn k's prompt is the chat template of the original system, user and tool messages up to uk, with
the model's own answers to turns 0..k-1 in place of the original assistant messages, and
`add_generation_prompt=True`. An answer enters the history the way a deployed chat layer puts it
there (`chat_layer.ChatLayer`: decoded, split into `reasoning_content`, `content` and `tool_calls`).
Text only builds the next turn's messages: each turn's row holds the `prompt_ids` that were sent and
the `output_ids` the server returned.

Tool results: where the original conversation answers an assistant tool call with tool messages,
they are spliced in after the regenerated answer when it calls *the same tools*: the same function
names, in the same order and number (the arguments may differ: the original results answered the
original arguments). Each result's `tool_call_id` is rewritten to the regenerated call's id.
Where the regenerated answer calls other tools (or none, or some where the original answered in
text), the results cannot answer it: with `tool_divergence: end` (the default) the conversation
ends there; with `original`, the original assistant message and its results take the answer's place
and the later turns are regenerated on that history (each still on the model's own answers after
it, where their tools match). Each turn says which (`history_kind`: on_policy, or original from the
first turn rendered on an original answer on).

A conversation ends early, never silently: after a failed turn, a turn cut at `max_new_tokens` or
stopped as a repetition loop (finish_type `loop`), a tool mismatch, an empty message in the original
conversation (a turn never written or an answer lost: the turns whose history holds it), or a next
prompt that does not fit the context, its later turns become skipped rows carrying the reason, and
the turns before stay.

`turn_ends` (a prompts table column) says where each turn's history ends in the conversation; with
`turns: last` it has one entry and this module only ever makes the one request of the prompts row.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.settings import Budget, ModelProfile, stable_hash
from eagle3_datagen.storage.prompt_rows import empty_message
from eagle3_datagen.tokens.token_facts import output_budget

TURN_MODES = ("all", "last")
# What follows a regenerated answer whose tool calls the original results cannot answer (config
# tool_divergence): the conversation ends, or goes on with the original message in its place.
DIVERGENCE = ("end", "original")
ON_POLICY, ORIGINAL = "on_policy", "original"  # a row's history: the model's own answers only, or not


def turn_ends(messages: list[dict], mode: str) -> list[int]:
    """Where each regenerated turn's history ends in `messages` (exclusive): with `all`, after every
    user or tool message that an assistant message follows (and at the end); with `last`, the end.

    Assistant messages before the first user message are history, never regenerated."""
    if mode not in TURN_MODES:
        raise ValueError(f"turns must be one of {', '.join(TURN_MODES)}, not {mode!r}")
    if mode == "last":
        return [len(messages)]
    ends, seen_user = [], False
    for i, m in enumerate(messages):
        seen_user = seen_user or m["role"] == "user"
        following = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if seen_user and m["role"] != "assistant" and following in ("assistant", None):
            ends.append(i + 1)
    return ends or [len(messages)]


def turn_seed(seed: int, turn: int) -> int:
    """The seed of a turn: the row's own for turn 0, a stable draw from it for later turns."""
    return seed if turn == 0 else int(stable_hash([seed, turn])[:15], 16) % (2**31 - 1)


def call_names(calls: list[dict]) -> list[str]:
    return [c.get("function", {}).get("name", "") for c in calls]


def splice_tool_results(original: list[dict], answer: dict, following: list[dict]) -> tuple[list[dict], str | None]:
    """The messages after a regenerated answer: `following` (the original's), with its leading tool
    results answering the regenerated calls. A reason instead when the results cannot answer them.

    `original` is the assistant turn the answer replaces (one or more assistant messages)."""
    n = 0
    while n < len(following) and following[n]["role"] == "tool":
        n += 1
    calls = answer.get("tool_calls") or []
    if not n:
        if calls:
            goes_on = f"goes on with a {following[0]['role']} message" if following else "ends"
            return [], (
                f"the regenerated answer calls {', '.join(call_names(calls))} but the original conversation {goes_on}, "
                "not with their results"
            )
        return list(following), None
    original_calls = [c for m in original for c in (m.get("tool_calls") or [])]
    if call_names(calls) != call_names(original_calls):
        return [], (
            f"tool mismatch: the regenerated answer calls [{', '.join(call_names(calls))}] where the original called "
            f"[{', '.join(call_names(original_calls))}], whose results follow"
        )
    new_id = {c.get("id"): calls[i]["id"] for i, c in enumerate(original_calls)}
    spliced = []
    for position, result in enumerate(following[:n]):
        target = new_id.get(result.get("tool_call_id"))
        if target is None:  # a result whose id names no call: answer the calls in order
            target = calls[min(position, len(calls) - 1)]["id"]
        spliced.append(dict(result, tool_call_id=target))
    return spliced + list(following[n:]), None


class TurnBuilder:
    """Builds the requests of a category's conversations: turn 0 from the prompts row, each later
    turn from the model's answer to the one before. The tokenizer is loaded on first use (a later
    turn, or the generate step's check of its servers' answers), so a job that sends nothing never
    loads it."""

    def __init__(
        self,
        template: RequestTemplate,
        profile: ModelProfile,
        budget: Budget,
        *,
        tokenizer_sha256: str | None = None,
        load: Callable | None = None,
        templates: dict[str, RequestTemplate] | None = None,
        tool_divergence: str = "end",
    ):
        """`template` and `profile` are the first mode's; `templates` has every mode's (by name)
        where the profile has several (`settings.ModelProfile.modes`)."""
        if tool_divergence not in DIVERGENCE:
            raise ValueError(f"tool_divergence must be one of {', '.join(DIVERGENCE)}, not {tool_divergence!r}")
        self.tool_divergence = tool_divergence
        self.template = template
        self.profile = profile
        self.templates = templates or {profile.mode: template}
        self.budget = budget
        self.tokenizer_sha256 = tokenizer_sha256
        self._load = load
        self._tokenizer = None
        self._layers: dict = {}

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from eagle3_datagen.tokens.vocabulary import load_tokenizer, tokenizer_fingerprint

            tokenizer = self._load() if self._load is not None else load_tokenizer(self.profile)
            found = tokenizer_fingerprint(tokenizer)["tokenizer_sha256"]
            if self.tokenizer_sha256 and found != self.tokenizer_sha256:
                raise RuntimeError(
                    f"the tokenizer at {self.profile.tokenizer} (sha256 {found[:12]}) is not the one the prompts "
                    f"were tokenized with ({self.tokenizer_sha256[:12]}): tokenize the prompts again"
                )
            self._tokenizer = tokenizer
        return self._tokenizer

    @property
    def layer(self):
        """The chat layer of the first mode."""
        return self.layer_for(self.profile.mode)

    def layer_for(self, mode: str):
        """The chat layer of one mode: the next turn is rendered, and an answer parsed, as that mode does."""
        if mode not in self._layers:
            from eagle3_datagen.tokens.chat_layer import ChatLayer

            self._layers[mode] = ChatLayer(self.tokenizer, self.profile.for_mode(mode))
        return self._layers[mode]

    def mode_of(self, row: dict) -> str:
        """A prompts row's mode (a table made before modes has none: the profile's first)."""
        mode = row.get("mode") or self.profile.mode
        if mode not in self.templates:
            raise ValueError(
                f"row {row['id']} is in mode {mode!r}, which the model profile does not have "
                f"(its modes: {', '.join(self.templates)}): tokenize the prompts again"
            )
        return mode

    def request(self, row: dict, turn: int, prompt_ids: list[int], max_new_tokens: int) -> Request:
        mode = self.mode_of(row)
        template = self.templates[mode]
        req = Request(
            row["id"],
            int(row["sample_index"]),
            prompt_ids,
            int(max_new_tokens),
            turn_seed(int(row["seed"]), turn),
            turn=turn,
            mode=mode,
            template=template,
        )
        req.fingerprint = template.fingerprint(req)
        return req

    def start(self, row: dict) -> Conversation:
        """The conversation of a usable prompts row, at its first turn."""
        return Conversation(self, row)


class Conversation:
    """One (id, sample_index, mode) conversation, turn by turn: `request` is the current turn's request;
    `advance(result)` makes the next one, or ends the conversation (`end_reason`, None when every
    turn was made)."""

    def __init__(self, builder: TurnBuilder, row: dict):
        self.builder = builder
        self.row = row
        self.mode = builder.mode_of(row)
        self.ends = list(row.get("turn_ends") or ())
        self.turn = 0
        self._history: list | None = None  # read from the row's messages when first asked for
        self.request: Request = builder.request(row, 0, row["prompt_ids"], row["max_new_tokens"])
        self.end_reason: str | None = None
        # The first turn rendered on an original answer in place of the model's (tool_divergence: original).
        self.original_from: int | None = None

    @functools.cached_property
    def messages(self) -> list:
        messages = self.row["messages"]
        return json.loads(messages) if isinstance(messages, str) else messages

    @functools.cached_property
    def tools(self) -> list | None:
        return json.loads(self.row["tools"]) if self.row.get("tools") else None

    @property
    def history(self) -> list:
        """The messages the current turn's prompt was rendered from (its own user message last)."""
        if self._history is None:
            self._history = self.messages[: self.ends[0] if self.ends else len(self.messages)]
        return self._history

    @history.setter
    def history(self, history: list) -> None:
        self._history = history

    @property
    def turns(self) -> int:
        return len(self.ends) or 1

    def history_json(self) -> str:
        return json.dumps(self.history, ensure_ascii=False)

    @property
    def history_kind(self) -> str:
        """What the current turn's history holds: the model's own answers only, or an original one."""
        return ON_POLICY if self.original_from is None else ORIGINAL

    def _end(self, reason: str) -> None:
        self.end_reason = reason

    def advance(self, result: dict) -> Request | None:
        """The next turn's request after this turn's `result`, or None (the conversation is over).

        Whatever goes wrong in making the next turn ends this conversation with the reason; it never
        stops the others (a tokenizer that cannot be loaded, or is not the prompts', fails the job)."""
        if self.turn + 1 < self.turns and result["status"] == "ok":
            self.builder.tokenizer  # noqa: B018 (loaded here, outside the guard below)
        try:
            return self._advance(result)
        except Exception as exc:  # a parser or template error on one answer: this conversation ends
            self._end(
                f"turn {self.turn + 1} could not be made from turn {self.turn}'s answer: {type(exc).__name__}: {exc}"
            )
            return None

    def _advance(self, result: dict) -> Request | None:
        k = self.turn
        if k + 1 >= self.turns:
            return None
        later = self.turns - k - 1
        if result["status"] != "ok":
            self._end(f"turn {k} failed ({result.get('error', '')[:200]}): its {later} later turn(s) not generated")
            return None
        if result.get("finish_type") in ("length", LOOP_FINISH):
            how = "at max_new_tokens" if result["finish_type"] == "length" else "as a repetition loop"
            self._end(
                f"turn {k} was cut {how} ({len(result['output_ids'])} tokens): a cut answer cannot "
                f"continue the conversation; its {later} later turn(s) not generated"
            )
            return None
        empty = empty_message(self.messages[: self.ends[k + 1]], self.ends[k])
        if empty is not None:
            self._end(f"turn {k + 1} not generated: {empty}; {later} turn(s) not generated")
            return None
        layer = self.builder.layer_for(self.mode)
        answer = layer.answer_message(result["output_ids"], result.get("finish_type", ""), self.tools, self.history)
        segment = self.messages[self.ends[k] : self.ends[k + 1]]
        j = 0
        while j < len(segment) and segment[j]["role"] == "assistant":
            j += 1
        following, diverged = splice_tool_results(segment[:j], answer, segment[j:])
        if diverged is not None and self.builder.tool_divergence == "end":
            self._end(f"turn {k + 1} not generated: {diverged}; {later} turn(s) not generated")
            return None
        if diverged is not None:  # the original answer and its results stand in for the model's
            history = self.history + segment
        else:
            history = self.history + [answer] + following
        tokenized = layer.chat.tokenize([history], [self.tools])[0]
        if tokenized.error is not None:
            self._end(f"turn {k + 1}: the chat template cannot render its history: {tokenized.error}")
            return None
        max_new, why = output_budget(
            len(tokenized.prompt_ids),
            context_length=self.builder.profile.context_length,
            budget=self.builder.budget.for_mode(self.mode),
        )
        if why is not None:
            self._end(f"turn {k + 1} does not fit the context: {why}; {later} turn(s) not generated")
            return None
        self.turn, self.history = k + 1, history
        if diverged is not None and self.original_from is None:
            self.original_from = k + 1
        self.request = self.builder.request(self.row, k + 1, tokenized.prompt_ids, max_new)
        return self.request


@dataclass
class Step:
    """One turn of a walk: its conversation (at this turn), request, and result (None: not made yet)."""

    conversation: Conversation
    request: Request
    result: dict | None


def walk(conversation: Conversation, result_of: Callable[[Request], dict | None]) -> Iterator[Step]:
    """The turns of a conversation that `result_of` has results for, then the first one it has not
    (with result None), unless the conversation ended first."""
    req: Request | None = conversation.request
    while req is not None:
        result = result_of(req)
        yield Step(conversation, req, result)
        if result is None:
            return
        req = conversation.advance(result)


def follower(in_flight: dict) -> Callable[[Request, dict], Request | None]:
    """The client's follow-up (`GenerateClient.run(follow=...)`) over the conversations in flight,
    by request key (`plan_generation.requests_to_send` fills `in_flight`): a result's next turn."""

    def follow(req: Request, result: dict) -> Request | None:
        conversation = in_flight.pop(req.key)
        following = conversation.advance(result)
        if following is not None:
            in_flight[following.key] = conversation
        return following

    return follow
