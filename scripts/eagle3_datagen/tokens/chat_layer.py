"""What SGLang's OpenAI chat layer makes of an answer: the assistant message a deployed model's
history holds (`reasoning_content`, `content`, `tool_calls`).

Used by `check_parsers` (would the chat route give back the same tokens?) and by `turns` (the next
turn's history holds the model's answer as a chat layer would have put it). Text only builds messages;
token ids come from the server. As `serving_chat`: decode (a trailing stop id trimmed on `stop`; special
tokens skipped unless the row has tools), run the reasoning parser with the chat layer's forcing, then,
with tools, the tool-call parser, and name the calls as the parser does.
"""

from __future__ import annotations

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens import parsers
from eagle3_datagen.tokens.templating import ChatTokenizer
from eagle3_datagen.tokens.token_facts import optional_id, stop_set
from eagle3_datagen.tokens.vocabulary import batch_decode


class ChatLayer:
    """The chat layer of one model profile: decoding, reasoning and tool-call parsing."""

    def __init__(self, tokenizer, profile: ModelProfile):
        self.tokenizer = tokenizer
        self.profile = profile
        self.chat = ChatTokenizer(tokenizer, profile)
        self.version = parsers.parse_version(profile.sglang_version)
        # SGLang's detokenizer trims whatever id matched, the model's eos as well as a stop token.
        self.stops = set(stop_set(tokenizer, profile).ids)
        self.think_end = profile.reasoning_end or parsers.THINK_END
        self.think_end_id = optional_id(tokenizer, self.think_end)  # None: a model without one
        self.reasoning_parser = profile.reasoning_parser
        self.tool_parser = profile.tool_call_parser
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = "\n".join(str(t) for t in template.values())
        self.force = bool(self.reasoning_parser) and parsers.chat_force_reasoning(
            self.reasoning_parser, self.version, profile.chat_template_kwargs, template
        )

    def trimmed(self, output_ids: list[int], finish_type: str) -> list[int]:
        """The output without the matched stop id the chat layer trims."""
        cut = finish_type == "stop" and output_ids and output_ids[-1] in self.stops
        return list(output_ids[:-1] if cut else output_ids)

    def texts(self, outputs: list[list[int]], finish_types: list[str], has_tools: list[bool]) -> list[str]:
        """Decoded answers, as the chat layer decodes them, in two batches (special tokens kept with tools)."""
        trimmed = [self.trimmed(o, f) for o, f in zip(outputs, finish_types)]
        texts: list[str] = [""] * len(outputs)
        for skip in (True, False):
            idx = [i for i, t in enumerate(has_tools) if t != skip]
            decoded = batch_decode(self.tokenizer, [trimmed[i] for i in idx], skip_special_tokens=skip) if idx else []
            for i, text in zip(idx, decoded):
                texts[i] = text
        return texts

    def assistant_message(self, text: str, tools, history: list[dict]) -> tuple[dict, str]:
        """The assistant message a chat layer builds from a decoded answer, and its reasoning text."""
        reasoning, content = "", text
        if self.reasoning_parser:
            reasoning, content = parsers.parse_reasoning(
                text, parser=self.reasoning_parser, version=self.version, force_reasoning=self.force
            )
        calls: list[parsers.ToolCall] = []
        if tools and self.tool_parser:
            content, calls = parsers.parse_tool_calls(content, tools, parser=self.tool_parser, version=self.version)
        message: dict = {"role": "assistant", "content": content, "reasoning_content": reasoning or None}
        if calls:
            done = sum(len(m.get("tool_calls") or []) for m in history if m.get("role") == "assistant")
            message["tool_calls"] = [
                {
                    "id": parsers.tool_call_id(c, parser=self.tool_parser, history_count=done, position=i),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for i, c in enumerate(calls)
            ]
        return message, reasoning

    def answer_message(self, output_ids: list[int], finish_type: str, tools, history: list[dict]) -> dict:
        """The assistant message of one answer (`texts` + `assistant_message`)."""
        text = self.texts([list(output_ids)], [finish_type], [bool(tools)])[0]
        return self.assistant_message(text, tools, history)[0]


VERDICTS = (
    "exact",
    "reasoning_token_lost",
    "truncated_without_reasoning_end",
    "reasoning_dropped_by_template",
    "tool_call_reshaped",
    "text_after_tool_section_dropped",
    "whitespace_changed",
    "retokenization_drift",
    "other",
)
