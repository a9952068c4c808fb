"""check_parsers: does the OpenAI chat route give back the exact tokens we generated?

For each ok generation row this replays what SGLang's chat layer and a text-based trainer would do:

1. decode `output_ids` as `serving_chat` does: a trailing stop id is trimmed when `finish_type` is
   `stop`; `skip_special_tokens=True` unless the row has tools (then False);
2. run the profile's reasoning parser with the chat layer's forcing (`parsers.chat_force_reasoning`),
   then, for rows with tools, the tool-call parser (`parsers.parse_tool_calls`);
3. rebuild the assistant message (`reasoning_content`, `content`, `tool_calls` with Kimi ids
   `functions.{name}:{history + index}` and the arguments as the parser's raw JSON text), append it to
   the row's messages and render the whole conversation through the chat template with
   `add_generation_prompt=False`, then tokenize (no added special tokens; literal control text in
   system/user/tool messages is protected exactly as for `prompt_ids`);
4. compare the result (`route`) with `expected = prompt_ids + output_ids`.

Alignment: the row is `exact` when `route[:len(expected)] == expected` and every extra route token is
the template's own end of turn: whitespace-only tokens (Qwen3 renders `<|im_end|>\\n`), and, when
`expected` does not end with a stop id (a `length` or `loop` row), one stop id before them (the template
closes the turn that generation left open). Otherwise `first_diff` is the first index where the two
differ (or the length of the shorter one) and the row gets the first class that applies, in order:

- `reasoning_token_lost`: `output_ids` hold `</think>` but the decoded text does not (skipped as a
  special token), or the route has fewer `</think>` ids after the prompt than the output;
- `truncated_without_reasoning_end`: `finish_type` is `length` (or `loop`: stopped as a repetition loop
  while generated, cut as a budget cuts) and no `</think>` in `output_ids`
  (the parser calls it all reasoning; the template then closes a `</think>` that was never generated);
- `reasoning_dropped_by_template`: the parser found reasoning but the rendered conversation does not
  contain it (Kimi templates render `<think></think>` for an assistant turn without tool calls that
  is the last such turn: its reasoning is dropped);
- `tool_call_reshaped`: `first_diff` falls inside the tool section of `expected` (from the section's
  first token to its end token, or to the end of the output when it has none): ids, whitespace,
  argument text or the whole section differ;
- `text_after_tool_section_dropped`: `first_diff` lies after the section's end token;
- `whitespace_changed`: the decoded texts from `first_diff` on differ only in whitespace;
- `retokenization_drift`: the decoded texts from `first_diff` on are equal (same text, other ids);
- `other`.

May import: `settings`, `storage.tables`, `tokens` (the chat layer, parsers, templating, vocabulary),
`quality.flags` (the finish_type of a row stopped as a loop).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.storage.tables import Batching, TableWriter, count_rows, iter_batches, logged
from eagle3_datagen.tokens import parsers
from eagle3_datagen.tokens.chat_layer import VERDICTS, ChatLayer
from eagle3_datagen.tokens.templating import group_by_tools
from eagle3_datagen.tokens.vocabulary import batch_decode, load_tokenizer, token_ids

log = logging.getLogger(__name__)

# Answers cut before their end: by their budget, or stopped as a loop while generated.
CUT_FINISHES = ("length", LOOP_FINISH)

_SECTION_TOKENS = {
    "kimi_k2": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
    "qwen25": ("<tool_call>", "</tool_call>"),
}
_WS = re.compile(r"\s+")
EXCERPT_BEFORE, EXCERPT_AFTER = 12, 20


@dataclass
class RowFacts:
    """What the classification needs to know about one non-exact row."""

    finish_type: str
    n_end_output: int  # `</think>` ids in output_ids
    n_end_route: int  # `</think>` ids in the route after the prompt
    end_in_text: bool  # `</think>` survived the chat layer's decode
    reasoning: str  # parsed reasoning text
    rendered: str  # the re-rendered conversation
    section: tuple[int, int] | None  # tool section of expected: first token, end token (inclusive)
    first_diff: int
    expected_rest: list[int]  # expected[first_diff:]
    route_rest: list[int]  # route[first_diff:], without the tolerated template tail
    decode: Callable[[list[int]], str]

    # Decoded only when the cheaper rules did not decide.
    @cached_property
    def expected_tail(self) -> str:
        return self.decode(self.expected_rest)

    @cached_property
    def route_tail(self) -> str:
        return self.decode(self.route_rest)


def classify(f: RowFacts) -> str:
    if f.n_end_output and (not f.end_in_text or f.n_end_route < f.n_end_output):
        return "reasoning_token_lost"
    if f.finish_type in CUT_FINISHES and not f.n_end_output:
        return "truncated_without_reasoning_end"
    if f.reasoning.strip() and f.reasoning.strip() not in f.rendered:
        return "reasoning_dropped_by_template"
    if f.section is not None:
        start, end = f.section
        if start <= f.first_diff <= end:
            return "tool_call_reshaped"
        if f.first_diff > end:
            return "text_after_tool_section_dropped"
    if f.expected_tail == f.route_tail:
        return "retokenization_drift"
    if _WS.sub("", f.expected_tail) == _WS.sub("", f.route_tail):
        return "whitespace_changed"
    return "other"


class _Checker(ChatLayer):
    def __init__(self, tokenizer, profile: ModelProfile):
        super().__init__(tokenizer, profile)
        section = _SECTION_TOKENS.get(self.tool_parser or "")
        self.section_ids = tuple(token_ids(tokenizer, section)) if section else None
        self._ws_cache: dict[int, bool] = {}

    # -- comparison ----------------------------------------------------------------------

    def _is_ws(self, tid: int) -> bool:
        hit = self._ws_cache.get(tid)
        if hit is None:
            hit = self._ws_cache[tid] = self.tokenizer.decode([tid]).strip() == "" and tid not in self.stops
        return hit

    def tolerated_tail(self, route: list[int], expected_ends_with_stop: bool) -> int:
        """How many trailing route tokens are the template's own end of turn (see the module doc)."""
        j = len(route)
        while j > 0 and self._is_ws(route[j - 1]):
            j -= 1
        if not expected_ends_with_stop and j > 0 and route[j - 1] in self.stops:
            j -= 1
        return len(route) - j

    def decode(self, ids) -> str:
        return batch_decode(self.tokenizer, [list(ids)], skip_special_tokens=False)[0]


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # binary search on prefix equality (list slices compare in C)
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return next(i for i in range(lo, hi) if a[i] != b[i])


def _section_span(output: list[int], offset: int, section_ids) -> tuple[int, int] | None:
    """The tool section in `expected`: its first token to its last end token, or to the output's end."""
    if not section_ids or section_ids[0] not in output:
        return None
    begin, end = section_ids
    start, last = output.index(begin), len(output) - 1
    stop = last - output[::-1].index(end) if end in output else last
    return offset + start, offset + (stop if stop >= start else last)


def _routes(
    ck: _Checker, rows: list[dict], texts: list[str], tools_list: list
) -> tuple[list[list[int]], list[str], list[str]]:
    """Steps 2-3 for a batch: each row's answer parsed and rebuilt as an assistant message, its whole
    conversation rendered without a generation prompt and encoded, one batch per group of identical
    tools. Returns the route ids, the rendered texts and the parsed reasoning of each row."""
    routes: list[list[int] | None] = [None] * len(rows)
    rendered: list[str] = [""] * len(rows)
    reasonings: list[str] = [""] * len(rows)
    for idx in group_by_tools(tools_list).values():
        tools = tools_list[idx[0]]
        conversations = []
        for i in idx:
            history = json.loads(rows[i]["messages"])
            message, reasonings[i] = ck.assistant_message(texts[i], tools, history)
            conversations.append(history + [message])
        out, ids, _ = ck.chat.render_and_encode(conversations, tools, add_generation_prompt=False)
        for k, i in enumerate(idx):
            routes[i] = ids[k]
            rendered[i] = out[k]
    return routes, rendered, reasonings  # type: ignore[return-value]


def _reasoning_and_answer(ck: _Checker, output: list[int], n_end: int) -> tuple[int, int]:
    """How many output tokens are reasoning and how many answer: split at the first `</think>`, all
    reasoning when the parser takes an answer without one as reasoning (forced, or begun with
    `<think>`), else all answer."""
    if n_end:
        pos = output.index(ck.think_end_id)
        return pos, len(output) - pos - 1
    if ck.reasoning_parser and (
        ck.force or (output and ck.tokenizer.convert_ids_to_tokens(output[0]) == parsers.THINK_START)
    ):
        return len(output), 0
    return 0, len(output)


def check_rows(
    generations: list[dict], *, tokenizer, profile: ModelProfile, checkers: dict[str, _Checker] | None = None
) -> list[dict]:
    """One verdict row per ok generation row of a batch, in order (see the module doc for the rules);
    each row carries the messages and tools of its prompt, and is checked as its serving mode's chat
    route (that mode's template variables, and so its reasoning forcing). `checkers`, by mode, set up
    once, serve every batch."""
    checkers = {} if checkers is None else checkers
    ok = [g for g in generations if g["status"] == "ok"]
    by_mode: dict[str, list[int]] = {}
    for i, g in enumerate(ok):
        by_mode.setdefault(g.get("mode") or profile.mode, []).append(i)
    verdicts: list[dict] = [{} for _ in ok]
    for mode, indices in by_mode.items():
        if mode not in checkers:
            checkers[mode] = _Checker(tokenizer, profile.for_mode(mode))
        for i, verdict in zip(indices, _check_mode(checkers[mode], [ok[i] for i in indices])):
            verdicts[i] = verdict
    return verdicts


def _check_mode(ck: _Checker, rows: list[dict]) -> list[dict]:
    """The verdicts of ok rows of one mode."""
    tools_list = [json.loads(g["tools"]) if g["tools"] else None for g in rows]
    outputs = [list(g["output_ids"]) for g in rows]

    # 1. decode as the chat layer does, in two batches (special tokens skipped unless tools).
    texts = ck.texts(outputs, [g["finish_type"] for g in rows], [bool(t) for t in tools_list])

    # 2.-3. parse, rebuild, render per group of identical tools, encode in one batch per group.
    routes, rendered, reasonings = _routes(ck, rows, texts, tools_list)

    # 4. compare and classify.
    verdicts = []
    for i, g in enumerate(rows):
        prompt_ids, output = list(g["prompt_ids"]), outputs[i]
        expected = prompt_ids + output
        route = routes[i]
        ends_with_stop = bool(output) and output[-1] in ck.stops
        n_end = output.count(ck.think_end_id) if ck.think_end_id is not None else 0
        verdict, first_diff, exp_excerpt, route_excerpt = "exact", None, "", ""
        n = len(expected)
        if not (route[:n] == expected and ck.tolerated_tail(route, ends_with_stop) >= len(route) - n):
            core = route[: len(route) - ck.tolerated_tail(route, ends_with_stop)]
            first_diff = _first_diff(expected, core)
            facts = RowFacts(
                finish_type=g["finish_type"],
                n_end_output=n_end,
                n_end_route=route[len(prompt_ids) :].count(ck.think_end_id) if n_end else 0,  # type: ignore[arg-type]
                end_in_text=ck.think_end in texts[i],
                reasoning=reasonings[i],
                rendered=rendered[i],
                section=_section_span(output, len(prompt_ids), ck.section_ids),
                first_diff=first_diff,
                expected_rest=expected[first_diff:],
                route_rest=core[first_diff:],
                decode=ck.decode,
            )
            verdict = classify(facts)
            lo = max(0, first_diff - EXCERPT_BEFORE)
            exp_excerpt = ck.decode(expected[lo : first_diff + EXCERPT_AFTER])
            route_excerpt = ck.decode(core[lo : first_diff + EXCERPT_AFTER])
        n_reasoning, n_answer = _reasoning_and_answer(ck, output, n_end)
        verdicts.append(
            {
                "id": g["id"],
                "sample_index": int(g["sample_index"]),
                "turn": int(g["turn"]),
                "mode": ck.profile.mode,
                "verdict": verdict,
                "first_diff": first_diff,
                "excerpt_expected": exp_excerpt,
                "excerpt_route": route_excerpt,
                "n_reasoning_tokens": n_reasoning,
                "n_answer_tokens": n_answer,
                "has_tools": bool(tools_list[i]),
                "finish_type": g["finish_type"],
            }
        )
    return verdicts


def counts(verdict_rows: list[dict] | Counter) -> dict:
    """Rows per verdict, every class listed (zeros included), plus the total."""
    c = verdict_rows if isinstance(verdict_rows, Counter) else Counter(r["verdict"] for r in verdict_rows)
    out = {v: c.get(v, 0) for v in VERDICTS}
    out["total"] = sum(c.values())
    return out


def verdict_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("sample_index", pa.int32()),
            ("turn", pa.int32()),
            ("mode", pa.string()),
            ("verdict", pa.string()),
            ("first_diff", pa.int64()),
            ("excerpt_expected", pa.string()),
            ("excerpt_route", pa.string()),
            ("n_reasoning_tokens", pa.int32()),
            ("n_answer_tokens", pa.int32()),
            ("has_tools", pa.bool_()),
            ("finish_type", pa.string()),
        ]
    )


def check_parsers(
    *, generations: Path, verdicts: Path, verdict_counts: Path, model: dict, batch: dict | None = None
) -> dict:
    """A verdict per row in `verdicts`, their counts in `verdict_counts`, a batch at a time; reports, never fails."""
    profile = ModelProfile.from_config(model)
    tokenizer = load_tokenizer(profile)
    checkers: dict[str, _Checker] = {}
    batching = Batching.from_config(batch)
    semantics = {
        "reasoning_parser": profile.reasoning_parser,
        "tool_call_parser": profile.tool_call_parser,
        "sglang_version": profile.sglang_version,
    }
    per_mode: dict[str, Counter] = {}
    with TableWriter(verdicts, verdict_schema(), batching) as writer:
        for gens in logged(iter_batches(generations, batching), count_rows(generations), "check_parsers"):
            rows = check_rows(gens, tokenizer=tokenizer, profile=profile, checkers=checkers)
            for r in rows:
                per_mode.setdefault(r["mode"], Counter())[r["verdict"]] += 1
            writer.write(rows)
        writer.close(semantics)
    summary = {
        **semantics,
        "verdicts": counts(sum(per_mode.values(), Counter())),
        "verdicts_by_mode": {mode: counts(c) for mode, c in sorted(per_mode.items())},
    }
    verdict_counts.parent.mkdir(parents=True, exist_ok=True)
    verdict_counts.write_text(json.dumps(summary, indent=2) + "\n")
    log.info("%s", summary)
    return summary
