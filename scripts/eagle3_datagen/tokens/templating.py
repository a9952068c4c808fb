"""Client-side chat templating: the model's own template, rendered and tokenized here, never on the server.

`ChatTokenizer.tokenize` is `apply_chat_template(add_generation_prompt=True)` in batches of one `tools`
argument: Jinja rendering, then one `encode_batch`, the same ids at the speed of the bare tokenizer.

Control-token policy ("literal-as-text"): text in a system, user or tool message that spells a control
token (a user asking about `<|im_end|>`) is cut out before rendering and encoded as plain text, in
isolation: the same segment boundaries an added token would have made.

May import: `settings`, `tokens.vocabulary`, `tokens.encoding`.
"""

import functools
import json
import re
from dataclasses import dataclass

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens.encoding import ControlText, TextOnlyEncoder, TiktokenPath

CONTROL_TOKEN_POLICY = "literal-as-text"
# Private-use characters mark where literal control text was cut out of a message.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARK_RE = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


@dataclass
class Tokenized:
    prompt_ids: list[int]
    has_literal_control_text: bool
    # Why the conversation could not be rendered or encoded (its template raised, ...): the row is
    # skipped with this reason, and the rest of its batch goes on.
    error: str | None = None


class ChatTokenizer:
    """apply_chat_template(add_generation_prompt=True) for many conversations at once."""

    def __init__(self, tokenizer, profile: ModelProfile):
        self.tokenizer = tokenizer
        self.profile = profile
        self.control = ControlText(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tiktoken = TiktokenPath(tokenizer) if self._backend is None and TiktokenPath.applies(tokenizer) else None

    def _protect(self, messages: list[dict], literals: list[str]) -> list[dict]:
        """Replace literal control text in message fields with numbered marks, collecting the text."""

        def mark(literal: str) -> str:
            literals.append(literal)
            return f"{_MARK_OPEN}{len(literals) - 1}{_MARK_CLOSE}"

        protected = []
        for message in messages:
            # Assistant turns may carry real control tokens (a template splits them on `</think>`);
            # only text that a person or a tool wrote is protected.
            if message["role"] in ("system", "user", "tool"):
                content = message.get("content")
                if isinstance(content, str):
                    content = self.control.sub(mark, content)
                message = dict(message, content=content)
            protected.append(message)
        return protected

    def render(
        self, conversations: list[list[dict]], tools: list | None, *, add_generation_prompt: bool = True
    ) -> list[str]:
        rendered = self.tokenizer.apply_chat_template(
            conversations,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.profile.chat_template_kwargs,
        )
        return [rendered] if isinstance(rendered, str) else list(rendered)

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]
        if self._tiktoken is not None:
            return [self._tiktoken.encode(t) for t in texts]
        return [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]

    @functools.cached_property
    def _text_only(self) -> TextOnlyEncoder:
        return TextOnlyEncoder(self.tokenizer)

    def render_and_encode(
        self, conversations: list[list[dict]], tools: list | None, *, add_generation_prompt: bool = True
    ) -> tuple[list[str], list[list[int]], list[bool]]:
        """Render conversations that share one `tools` list and encode them in one batch: the rendered texts
        (marks where literal control text was cut out), the ids, and whether each held literal control text."""
        literal_lists: list[list[str]] = [[] for _ in conversations]
        protected = [self._protect(c, literals) for c, literals in zip(conversations, literal_lists)]
        texts = self.render(protected, tools, add_generation_prompt=add_generation_prompt)
        segments: list[str] = []
        layouts: list[list[int | str]] = []  # per row: an int indexes `segments`, a str is literal text
        for text, literals in zip(texts, literal_lists):
            layout: list[int | str] = []
            last = 0
            for m in _MARK_RE.finditer(text) if literals else ():
                if m.start() > last:
                    layout.append(len(segments))
                    segments.append(text[last : m.start()])
                layout.append(literals[int(m.group(1))])
                last = m.end()
            if last < len(text) or not layout:
                layout.append(len(segments))
                segments.append(text[last:])
            layouts.append(layout)
        encoded = self._encode_batch(segments)
        ids = []
        for layout in layouts:
            if len(layout) == 1 and isinstance(layout[0], int):
                ids.append(encoded[layout[0]])
                continue
            row: list[int] = []
            for part in layout:
                row.extend(encoded[part] if isinstance(part, int) else self._text_only.encode(part))
            ids.append(row)
        return texts, ids, [bool(lits) for lits in literal_lists]

    def tokenize(self, conversations: list[list[dict]], tools_list: list) -> list[Tokenized]:
        """Prompt ids of each conversation; rows are batched by identical tools."""
        results: list[Tokenized | None] = [None] * len(conversations)
        for indices in group_by_tools(tools_list).values():
            tools = tools_list[indices[0]]
            try:
                _, ids, literal = self.render_and_encode([conversations[i] for i in indices], tools)
            except Exception as exc:  # one bad conversation fails its batch: find it, keep the others
                for i in indices:
                    results[i] = (
                        Tokenized([], False, error=f"{type(exc).__name__}: {exc}")
                        if len(indices) == 1
                        else self.tokenize([conversations[i]], [tools])[0]
                    )
                continue
            for i, row, has_literal in zip(indices, ids, literal):
                results[i] = Tokenized(row, has_literal)
        return results  # type: ignore[return-value]


def group_by_tools(tools_list: list) -> dict[str, list[int]]:
    """Row indices grouped by identical tools: a chat-template batch takes one `tools` argument."""
    groups: dict[str, list[int]] = {}
    for i, tools in enumerate(tools_list):
        groups.setdefault(json.dumps(tools, sort_keys=True), []).append(i)
    return groups
