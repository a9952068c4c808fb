"""The turns of a conversation: every assistant turn regenerated on the model's own earlier answers
(docs/data.md, "Every turn on-policy"). Turn k's prompt is the chat template of the original system, user and tool messages up to uk, with the
model's answers to turns 0..k-1 (as `chat_layer.ChatLayer` parses them) in place of the original
assistant messages. Original tool results are spliced in after an answer that calls the same tools;
one that calls others has diverged (`tool_divergence`: the conversation ends, or goes on with the
original message). A conversation ends early, never silently: its later turns become skipped rows
with the reason. `turn_ends` (a prompts column) says where each turn's history ends.
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
DIVERGENCE = ("end", "original")
ON_POLICY, ORIGINAL = "on_policy", "original"  # a row's history: the model's own answers only, or not


def turn_ends(messages: list[dict], mode: str) -> list[int]:
    """Where each regenerated turn's history ends in `messages` (exclusive): with `all`, after every user
    or tool message that an assistant message follows (or the end), never before the first user message;
    with `last`, the end."""
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
    """The messages after a regenerated answer: `following` (the original's), its leading tool results
    answering the regenerated calls; or a reason why they cannot. `original`: the turn the answer replaces."""
    n = next((i for i, m in enumerate(following) if m["role"] != "tool"), len(following))
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
    """Builds the requests of a category's conversations: turn 0 from the prompts row, each later turn
    from the answer before. The tokenizer is loaded on first use: a job that sends nothing never loads it."""

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
        """`template` and `profile` are the first mode's; `templates`: every mode's, by name."""
        if tool_divergence not in DIVERGENCE:
            raise ValueError(f"tool_divergence must be one of {', '.join(DIVERGENCE)}, not {tool_divergence!r}")
        self.tool_divergence = tool_divergence
        self.template = template
        self.profile = profile
        self.templates = templates or {profile.mode: template}
        self.budget = budget
        self.tokenizer_sha256 = tokenizer_sha256
        self._load = load
        self._layers: dict = {}

    @functools.cached_property
    def tokenizer(self):
        from eagle3_datagen.tokens.vocabulary import load_tokenizer, tokenizer_fingerprint

        tokenizer = self._load() if self._load is not None else load_tokenizer(self.profile)
        found = tokenizer_fingerprint(tokenizer)["tokenizer_sha256"]
        if self.tokenizer_sha256 and found != self.tokenizer_sha256:
            raise RuntimeError(
                f"the tokenizer at {self.profile.tokenizer} (sha256 {found[:12]}) is not the one the prompts "
                f"were tokenized with ({self.tokenizer_sha256[:12]}): tokenize the prompts again"
            )
        return tokenizer

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
    """One (id, sample_index, mode) conversation: `request` is the current turn's; `advance` makes the next."""

    def __init__(self, builder: TurnBuilder, row: dict):
        self.builder = builder
        self.row = row
        self.mode = builder.mode_of(row)
        self.ends = list(row.get("turn_ends") or ())
        self.turn = 0
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

    @functools.cached_property
    def history(self) -> list:
        """The messages the current turn's prompt was rendered from (its own user message last)."""
        return self.messages[: self.ends[0] if self.ends else len(self.messages)]

    @property
    def turns(self) -> int:
        return len(self.ends) or 1

    @property
    def history_kind(self) -> str:
        """What the current turn's history holds: the model's own answers only, or an original one."""
        return ON_POLICY if self.original_from is None else ORIGINAL

    def _end(self, reason: str) -> None:
        self.end_reason = reason

    def advance(self, result: dict) -> Request | None:
        """The next turn's request after this turn's `result`, or None; a failure ends this conversation only."""
        if self.turn + 1 < self.turns and result["status"] == "ok":
            self.builder.tokenizer  # noqa: B018 (loaded here, outside the guard below)
        try:
            return self._advance(result)
        except Exception as exc:  # a parser or template error on one answer: this conversation ends
            return self._end(
                f"turn {self.turn + 1} could not be made from turn {self.turn}'s answer: {type(exc).__name__}: {exc}"
            )

    def _advance(self, result: dict) -> Request | None:
        k = self.turn
        if k + 1 >= self.turns:
            return None
        later = self.turns - k - 1
        if result["status"] != "ok":
            return self._end(
                f"turn {k} failed ({result.get('error', '')[:200]}): its {later} later turn(s) not generated"
            )
        if result.get("finish_type") in ("length", LOOP_FINISH):
            how = "at max_new_tokens" if result["finish_type"] == "length" else "as a repetition loop"
            return self._end(
                f"turn {k} was cut {how} ({len(result['output_ids'])} tokens): a cut answer cannot "
                f"continue the conversation; its {later} later turn(s) not generated"
            )
        empty = empty_message(self.messages[: self.ends[k + 1]], self.ends[k])
        if empty is not None:
            return self._end(f"turn {k + 1} not generated: {empty}; {later} turn(s) not generated")
        layer = self.builder.layer_for(self.mode)
        answer = layer.answer_message(result["output_ids"], result.get("finish_type", ""), self.tools, self.history)
        segment = self.messages[self.ends[k] : self.ends[k + 1]]
        j = next((i for i, m in enumerate(segment) if m["role"] != "assistant"), len(segment))
        following, diverged = splice_tool_results(segment[:j], answer, segment[j:])
        if diverged is not None and self.builder.tool_divergence == "end":
            return self._end(f"turn {k + 1} not generated: {diverged}; {later} turn(s) not generated")
        # Diverged (tool_divergence: original): the original answer and its results stand in for the model's.
        history = self.history + (segment if diverged is not None else [answer, *following])
        tokenized = layer.chat.tokenize([history], [self.tools])[0]
        if tokenized.error is not None:
            return self._end(f"turn {k + 1}: the chat template cannot render its history: {tokenized.error}")
        max_new, why = output_budget(
            len(tokenized.prompt_ids),
            context_length=self.builder.profile.context_length,
            budget=self.builder.budget.for_mode(self.mode),
        )
        if why is not None:
            return self._end(f"turn {k + 1} does not fit the context: {why}; {later} turn(s) not generated")
        self.turn, self.history = k + 1, history
        if diverged is not None and self.original_from is None:
            self.original_from = k + 1
        self.request = self.builder.request(self.row, k + 1, tokenized.prompt_ids, max_new)
        return self.request


@dataclass
class Step:
    """One turn of a walk: its request, and result (None: not made yet)."""

    request: Request
    result: dict | None


def walk(conversation: Conversation, result_of: Callable[[Request], dict | None]) -> Iterator[Step]:
    """The turns of a conversation that `result_of` has results for, then the first it has not (result None)."""
    req: Request | None = conversation.request
    while req is not None:
        result = result_of(req)
        yield Step(req, result)
        if result is None:
            return
        req = conversation.advance(result)


def follower(in_flight: dict) -> Callable[[Request, dict], Request | None]:
    """The client's follow-up (`GenerateClient.run(follow=...)`) over the conversations `in_flight` by key."""

    def follow(req: Request, result: dict) -> Request | None:
        conversation = in_flight.pop(req.key)
        following = conversation.advance(result)
        if following is not None:
            in_flight[following.key] = conversation
        return following

    return follow
