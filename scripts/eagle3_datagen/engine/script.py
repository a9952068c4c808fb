"""The scripted backend's answers: deterministic outputs shaped like a reasoning model's, planned
from a tokenizer alone (`AnswerScript`). Imports `jobs` only (for the type of a job).
"""

import hashlib
import json
import math
import random
import re
from typing import Any

from eagle3_datagen.engine.jobs import Job


class AnswerScript:
    """The planned output of a request, from a RNG seeded by sha256(input_ids, sampling_seed): an answer
    ([`<think>` "\\n"] reasoning words, `</think>`, "\\n\\n", answer words, the stop token), a tool call
    (where the tokenizer has Kimi's or Qwen's tool tokens and the prompt declares tools: reasoning,
    `</think>`, a tool-call section, stop), or a ramble (reasoning words run on to `max_new_tokens`).
    Special ids are read from the tokenizer; `answer_tokens=(lo, hi)` draws long reasoning lengths."""

    WORDS = (
        "The user asks about this. Let me think step by step. First, consider the numbers; "
        "then add them carefully. We should check the result twice, since small errors matter. "
        "Hmm, wait: the second value is larger than the first, so the order changes. "
        "Overall the answer follows from these facts, and it is 42 or close to it."
    )

    def __init__(self, tokenizer: Any, eos_token_ids: frozenset, *, deterministic: bool = False,
                 ramble_rate: float = 0.15, tool_rate: float = 0.5, eos_rate: float = 0.0,
                 answer_tokens: tuple[int, int] | None = None, answer_spread: str = "uniform"):  # fmt: skip
        self.tokenizer = tok = tokenizer
        self.eos_token_ids, self.deterministic = eos_token_ids, deterministic
        self.ramble_rate, self.tool_rate, self.eos_rate = ramble_rate, tool_rate, eos_rate
        self.answer_tokens, self.answer_spread = answer_tokens, answer_spread

        def tid(token: str) -> int | None:
            i = tok.convert_tokens_to_ids(token)
            return None if i is None or i == tok.unk_token_id and token != tok.unk_token else i

        self.think_id = tid("<think>")
        self.think_end_id = tid("</think>")
        kimi = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>", "<|tool_call_end|>")  # fmt: skip
        self.kimi_tool = {name: tid(name) for name in kimi}
        self.qwen_tool = {name: tid(name) for name in ("<tool_call>", "</tool_call>")}
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        self.word_ids = [enc((" " if i else "") + w) for i, w in enumerate(self.WORDS.split())]
        self.enc = enc
        special = set(tok.all_special_ids) | set(self.eos_token_ids)
        self.filler_ids = sorted({t for w in self.word_ids for t in w} - special)
        self.word_cycle = [t for w in self.word_ids for t in w]
        self.turn_end_id = _turn_end(tok)

    def rng(self, job: Job) -> random.Random:
        h = hashlib.sha256()
        seed = job.params.sampling_seed if self.deterministic else None  # ignored, as SGLang does
        h.update(json.dumps([job.input_ids, seed]).encode())
        return random.Random(int.from_bytes(h.digest()[:8], "big"))

    def long_words(self, rng: random.Random, n: int) -> list[int]:
        """`n` tokens of reasoning words: copies of the word cycle, each turned at a random point, as
        a loop-free answer must not repeat with any period for long (the quality gate stops loops)."""
        cycle, out = self.word_cycle, []
        while len(out) < n:
            start = rng.randrange(len(cycle))
            out += cycle[start:]
            out += cycle[:start]
        return out[:n]

    def _words(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        start = rng.randrange(len(self.word_ids))
        for k in range(n):
            out.extend(self.word_ids[(start + k) % len(self.word_ids)])
        return out

    def _tool_section(self, rng: random.Random, prompt_text: str) -> list[int] | None:
        names = re.findall(r'"name"\s*:\s*"([A-Za-z0-9_\-\.]+)"', prompt_text)
        name = names[0] if names else "get_weather"
        args = json.dumps({"city": rng.choice(["Paris", "Berlin", "Tokyo"])})
        k = self.kimi_tool
        if all(v is not None for v in k.values()) and "tool_declare" in prompt_text:
            return [k["<|tool_calls_section_begin|>"], k["<|tool_call_begin|>"], *self.enc(f"functions.{name}:0"),
                    k["<|tool_call_argument_begin|>"], *self.enc(args), k["<|tool_call_end|>"],
                    k["<|tool_calls_section_end|>"]]  # fmt: skip
        q = self.qwen_tool
        if all(v is not None for v in q.values()) and "<tools>" in prompt_text:
            body = json.dumps({"name": name, "arguments": json.loads(args)})
            return [q["<tool_call>"]] + self.enc("\n" + body + "\n") + [q["</tool_call>"]]
        return None

    def _answer_length(self, rng: random.Random) -> int:
        """Reasoning tokens of a long answer: uniform in [lo, hi], or (`answer_spread` lognormal) long-
        tailed as real answer lengths are, median sqrt(lo * hi), lo and hi two sigmas out, clipped."""
        lo, hi = self.answer_tokens
        if self.answer_spread != "lognormal" or lo >= hi:
            return rng.randint(lo, hi)
        sigma = math.log(hi / max(lo, 1)) / 4
        return max(lo, min(hi, round(rng.lognormvariate(math.log(math.sqrt(max(lo, 1) * hi)), sigma))))

    def plan(self, job: Job) -> list[int]:
        """The full intended output for `job`, before stopping rules cut or extend it."""
        rng = self.rng(job)
        planned: list[int] = []
        # A prompt that closed an empty reasoning (instant mode: Kimi's <think></think>, Qwen3's
        # <think>\n\n</think>\n\n) is answered directly, as the model does: no reasoning of its own.
        closed = self.think_end_id is not None and self._closes_reasoning(job.input_ids)
        if not closed and self.think_id is not None and (not job.input_ids or job.input_ids[-1] != self.think_id):
            planned += [self.think_id] + self.enc("\n")
        ramble = rng.random() < self.ramble_rate or self.think_end_id is None
        long = self.answer_tokens is not None
        planned += self.long_words(rng, self._answer_length(rng)) if long else self._words(rng, rng.randint(4, 40))
        if ramble:
            return planned  # the stopping loop extends it with filler to max_new_tokens
        planned += [] if closed else [self.think_end_id]
        tool = None
        tools = self.kimi_tool["<|tool_calls_section_begin|>"] is not None or self.qwen_tool["<tool_call>"] is not None
        if rng.random() < self.tool_rate and tools:
            tool = self._tool_section(rng, self.tokenizer.decode(job.input_ids[-4096:], skip_special_tokens=False))
        if tool is not None:
            planned += self.enc("Let me check.") + tool
        else:
            planned += self.enc("\n\n") + self._words(rng, rng.randint(2, 20))
        stop = self._preferred_stop(job, rng)
        return planned + ([stop] if stop is not None else [])

    def _closes_reasoning(self, input_ids: list[int]) -> bool:
        """Whether the prompt ends with a reasoning end token, after whitespace at most."""
        for tid in reversed(input_ids[-8:]):
            if tid == self.think_end_id:
                return True
            if self.tokenizer.decode([tid]).strip():
                return False
        return False

    def _preferred_stop(self, job: Job, rng: random.Random) -> int | None:
        """The id an answer ends on: its turn's end, as a chat model ends a turn — the token the chat
        template closes an assistant message with (<|im_end|>) where the request stops on it, else the
        tokenizer's eos where it does, else the request's lowest stop id. A request may stop on other
        eos ids too (Kimi-K2.5's [EOS]): a chat model does not end its turns on them. With `eos_rate`,
        an answer ends on the model's eos instead where that differs, as a real answer sometimes does."""
        requested = set(job.params.stop_token_ids)
        candidates = set(self.eos_token_ids) | requested
        if not candidates:
            return None
        eos = self.tokenizer.eos_token_id
        if self.turn_end_id in candidates and (self.turn_end_id in requested or not requested):
            turn_end = self.turn_end_id
        elif eos in candidates and (eos in requested or not requested):
            turn_end = eos
        else:
            turn_end = min(requested or candidates)
        if self.eos_rate and eos in self.eos_token_ids and eos != turn_end and rng.random() < self.eos_rate:
            return eos
        return turn_end


def _turn_end(tok: Any) -> int | None:
    """The special token the chat template closes an assistant message with, or None."""
    mark = "Zq7Xj"
    try:
        text = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}], tokenize=False
        )
    except Exception:  # a template that takes no such conversation: the eos decides
        return None
    if mark not in text:  # a template that drops the answer's text: nothing to read after it
        return None
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    after = tok.encode(text[text.rfind(mark) + len(mark) :], add_special_tokens=False)
    return next((i for i in after if i in special), None)
