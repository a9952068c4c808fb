"""Client-side chat templating: the model's own template, rendered and tokenized here, never on the server.

`ChatTokenizer.tokenize` is `apply_chat_template(add_generation_prompt=True)` done in batches (a batch
takes one `tools` argument, so rows are grouped by their tools) as Jinja rendering followed by one
`encode_batch` of the rendered strings: the same ids as `apply_chat_template(tokenize=True)`, at the
speed of the bare tokenizer.

Control-token policy ("literal-as-text"): text inside a system, user or tool message that spells a
control token (a user asking about `<|im_end|>`) must not become that token. Such spans are cut out before rendering and
encoded as plain text, in isolation — the same segment boundaries an added token would have made.

May import: `settings`, `tokens.vocabulary`, `tokens.encoding`.
"""

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
        self._text_only: TextOnlyEncoder | None = None
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tiktoken = TiktokenPath(tokenizer) if self._backend is None and TiktokenPath.applies(tokenizer) else None

    def _protect(self, messages: list[dict], literals: list[str]) -> list[dict]:
        """Replace literal control text in message fields with numbered marks, collecting the text."""

        def protect_text(text):
            if not isinstance(text, str):
                return text
            spans = self.control.spans(text)
            if not spans:
                return text
            out, last = [], 0
            for start, end in spans:
                out.append(text[last:start])
                out.append(f"{_MARK_OPEN}{len(literals)}{_MARK_CLOSE}")
                literals.append(text[start:end])
                last = end
            out.append(text[last:])
            return "".join(out)

        protected = []
        for message in messages:
            # Assistant turns may carry real control tokens (a template splits them on `</think>`);
            # only text that a person or a tool wrote is protected.
            if message["role"] in ("system", "user", "tool"):
                message = dict(message, content=protect_text(message.get("content")))
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

    def _text_only_encoder(self) -> TextOnlyEncoder:
        if self._text_only is None:
            self._text_only = TextOnlyEncoder(self.tokenizer)
        return self._text_only

    def render_and_encode(
        self, conversations: list[list[dict]], tools: list | None, *, add_generation_prompt: bool = True
    ) -> tuple[list[str], list[list[int]], list[bool]]:
        """Render conversations that share one `tools` list and encode them in one batch.

        Returns the rendered texts (with marks where literal control text was cut out), the ids,
        and whether each conversation held literal control text. The template's text between marks
        goes into a single `encode_batch` with every other row; the literal text is encoded as text.
        """
        literal_lists: list[list[str]] = []
        protected = []
        for conversation in conversations:
            literals: list[str] = []
            protected.append(self._protect(conversation, literals))
            literal_lists.append(literals)
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
                row.extend(encoded[part] if isinstance(part, int) else self._text_only_encoder().encode(part))
            ids.append(row)
        return texts, ids, [bool(lits) for lits in literal_lists]

    def tokenize(self, conversations: list[list[dict]], tools_list: list) -> list[Tokenized]:
        """Prompt ids of each conversation; rows are batched by identical tools."""
        results: list[Tokenized | None] = [None] * len(conversations)
        for indices in group_by_tools(tools_list).values():
            tools = tools_list[indices[0]]
            try:
                _, ids, literal = self.render_and_encode([conversations[i] for i in indices], tools)
            except Exception:  # one bad conversation fails its batch: find it, keep the others
                for i in indices:
                    results[i] = self._tokenize_one(conversations[i], tools)
                continue
            for i, row, has_literal in zip(indices, ids, literal):
                results[i] = Tokenized(row, has_literal)
        return results  # type: ignore[return-value]

    def _tokenize_one(self, conversation: list[dict], tools) -> Tokenized:
        try:
            _, ids, literal = self.render_and_encode([conversation], tools)
        except Exception as exc:
            return Tokenized([], False, error=f"{type(exc).__name__}: {exc}")
        return Tokenized(ids[0], literal[0])


def group_by_tools(tools_list: list) -> dict[str, list[int]]:
    """Row indices grouped by identical tools: a chat-template batch takes one `tools` argument."""
    groups: dict[str, list[int]] = {}
    for i, tools in enumerate(tools_list):
        groups.setdefault(json.dumps(tools, sort_keys=True), []).append(i)
    return groups
