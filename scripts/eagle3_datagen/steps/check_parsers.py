"""check_parsers: does the OpenAI chat route give back the exact tokens we generated? (docs/quality.md)

Each ok row's output is decoded, parsed and rendered back as SGLang's chat layer would (the `route`)
and compared with `prompt_ids + output_ids`. It is `exact` when the route starts with them and every
extra token is the template's own end of turn (whitespace tokens, and one stop id where the output
ended without one); otherwise `classify` names the first way the tokens were lost, `first_diff` where.
Kimi templates drop the reasoning of the last assistant turn without tool calls
(`reasoning_dropped_by_template`); a cut answer without `</think>` gets one the model never generated.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

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


def classify(ck, row: dict, expected, route, core, first_diff: int, n_end: int, text, reasoning, rendered) -> str:
    """How a row that is not exact lost its tokens, the first class that applies: `core` is the
    route without the tolerated template tail, `n_end` the `</think>` ids in the output, `text` the
    output as the chat layer decoded it, `reasoning` what the parser took as reasoning."""
    n_prompt = len(row["prompt_ids"])
    if n_end and (ck.think_end not in text or route[n_prompt:].count(ck.think_end_id) < n_end):
        return "reasoning_token_lost"
    if row["finish_type"] in CUT_FINISHES and not n_end:
        return "truncated_without_reasoning_end"
    if reasoning.strip() and reasoning.strip() not in rendered:
        return "reasoning_dropped_by_template"
    section = _section_span(expected[n_prompt:], n_prompt, ck.section_ids)
    if section is not None:
        if section[0] <= first_diff <= section[1]:
            return "tool_call_reshaped"
        if first_diff > section[1]:
            return "text_after_tool_section_dropped"
    # Decoded only when the cheaper rules did not decide.
    expected_tail, route_tail = ck.decode(expected[first_diff:]), ck.decode(core[first_diff:])
    if expected_tail == route_tail:
        return "retokenization_drift"
    if _WS.sub("", expected_tail) == _WS.sub("", route_tail):
        return "whitespace_changed"
    return "other"


class _Checker(ChatLayer):
    def __init__(self, tokenizer, profile: ModelProfile):
        super().__init__(tokenizer, profile)
        section = _SECTION_TOKENS.get(self.tool_parser or "")
        self.section_ids = tuple(token_ids(tokenizer, section)) if section else None
        # Whether an id decodes to whitespace alone, asked once per id.
        self._is_ws = functools.cache(lambda tid: tokenizer.decode([tid]).strip() == "" and tid not in self.stops)

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


def _section_span(output: list[int], offset: int, section_ids) -> tuple[int, int] | None:
    """The tool section in `expected`: its first token to its last end token, or to the output's end."""
    if not section_ids or section_ids[0] not in output:
        return None
    begin, end = section_ids
    start, last = output.index(begin), len(output) - 1
    stop = last - output[::-1].index(end) if end in output else last
    return offset + start, offset + (stop if stop >= start else last)


def _routes(ck: _Checker, rows: list[dict], texts: list[str], tools_list: list) -> tuple[dict, dict, dict]:
    """(route ids, rendered text, parsed reasoning) by row index: each row's answer parsed into an
    assistant message, its conversation rendered and encoded a batch per group of identical tools."""
    routes, rendered, reasonings = {}, {}, {}
    for idx in group_by_tools(tools_list).values():
        tools = tools_list[idx[0]]
        conversations = []
        for i in idx:
            history = json.loads(rows[i]["messages"])
            message, reasonings[i] = ck.assistant_message(texts[i], tools, history)
            conversations.append(history + [message])
        out, ids, _ = ck.chat.render_and_encode(conversations, tools, add_generation_prompt=False)
        routes.update(zip(idx, ids))
        rendered.update(zip(idx, out))
    return routes, rendered, reasonings


def _reasoning_and_answer(ck: _Checker, output: list[int], n_end: int) -> tuple[int, int]:
    """(reasoning, answer) output tokens: split at the first `</think>`; without one, all reasoning where
    the parser takes it so (forced, or begun with `<think>`), else all answer."""
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
    """One verdict row per ok generation row of a batch, in order, each checked as its serving mode's
    chat route; `checkers`, by mode, set up once, serve every batch."""
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
    texts = ck.texts(outputs, [g["finish_type"] for g in rows], [bool(t) for t in tools_list])
    routes, rendered, reasonings = _routes(ck, rows, texts, tools_list)
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
            n = min(len(expected), len(core))
            differ = np.flatnonzero(np.asarray(expected[:n]) != np.asarray(core[:n]))
            first_diff = int(differ[0]) if differ.size else n
            verdict = classify(ck, g, expected, route, core, first_diff, n_end, texts[i], reasonings[i], rendered[i])
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


VERDICT_SCHEMA = pa.schema(
    {
        "id": pa.string(),
        "sample_index": pa.int32(),
        "turn": pa.int32(),
        "mode": pa.string(),
        "verdict": pa.string(),
        "first_diff": pa.int64(),
        "excerpt_expected": pa.string(),
        "excerpt_route": pa.string(),
        "n_reasoning_tokens": pa.int32(),
        "n_answer_tokens": pa.int32(),
        "has_tools": pa.bool_(),
        "finish_type": pa.string(),
    }
)


def check_parsers(
    *, generations: Path, verdicts: Path, verdict_counts: Path, model: dict, batch: dict | None = None
) -> dict:
    """A verdict per row in `verdicts`, their counts in `verdict_counts`, a batch at a time; reports, never fails."""
    profile = ModelProfile.from_config(model)
    tokenizer = load_tokenizer(profile)
    checkers: dict[str, _Checker] = {}
    batching = Batching.from_config(batch)
    semantics = {key: getattr(profile, key) for key in ("reasoning_parser", "tool_call_parser", "sglang_version")}
    per_mode: dict[str, Counter] = {}
    with TableWriter(verdicts, VERDICT_SCHEMA, batching) as writer:
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
