"""Text to ids outside the chat template: control-token spans, text encoded with no added-token
matching, and a TikToken tokenizer's fast path.

May import: `settings`, `tokens.vocabulary`.
"""

import re

from eagle3_datagen.tokens.vocabulary import tiktoken_model


def control_strings(tokenizer) -> set[str]:
    """Every string the tokenizer turns into one special or added id: its added tokens and, for a
    TikToken tokenizer, every special token of the Encoding (Kimi's 256 ids, named or reserved)."""
    strings = {t.content for t in tokenizer.added_tokens_decoder.values()}
    model = tiktoken_model(tokenizer)
    if model is not None:
        strings |= set(model.special_tokens_set)
    return {s for s in strings if s}


class ControlText:
    """Finds spans of text that spell one of the tokenizer's special or added (control) tokens."""

    def __init__(self, tokenizer):
        # By first character, then by length, longest first (the longest match wins): one regular
        # expression of every string tries them one by one at each place, 175 times slower with
        # ten thousand added tokens.
        self._by_first: dict[str, set[str]] = {}
        for s in control_strings(tokenizer):
            self._by_first.setdefault(s[0], set()).add(s)
        self._lengths = {c: sorted({len(s) for s in group}, reverse=True) for c, group in self._by_first.items()}
        self._first = re.compile("[" + "".join(map(re.escape, self._by_first)) + "]") if self._by_first else None

    def spans(self, text: str) -> list[tuple[int, int]]:
        found, pos = [], 0
        while self._first is not None and (m := self._first.search(text, pos)):
            start, first = m.start(), text[m.start()]
            end = next((start + n for n in self._lengths[first] if text[start : start + n] in self._by_first[first]), 0)
            if end:
                found.append((start, end))
            pos = end or start + 1
        return found

    def sub(self, replace, text: str) -> str:
        """`text` with each span replaced by `replace(span's text)`."""
        out, last = [], 0
        for start, end in self.spans(text):
            out += [text[last:start], replace(text[start:end])]
            last = end
        return "".join(out) + text[last:]


class TextOnlyEncoder:
    """Encodes text with no added- or special-token matching: what a control string typed by a user becomes.
    Fast tokenizers: the normalizer, pre-tokenizer and model run on the whole string; TikToken ones: the
    Encoding's ordinary encoding (Kimi's `encode(text, allow_special_tokens=False)`)."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tiktoken = tiktoken_model(tokenizer) if backend is None else None
        if backend is None and self._tiktoken is None:
            raise NotImplementedError(
                f"literal control text needs a fast tokenizer (tokenizer.json) or a TikToken one; {type(tokenizer).__name__} is neither"
            )
        self._backend = backend

    def encode(self, text: str) -> list[int]:
        if self._tiktoken is not None:
            return self._tiktoken.encode(text, disallowed_special=())
        backend = self._backend
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else [(text, None)]
        return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]


class TiktokenPath:
    """The ids of a slow TikToken tokenizer's own path, at the speed of its own `encode`.

    transformers' slow `encode(text, add_special_tokens=False)` splits the text on the added tokens
    and encodes each piece. When every added token is a special token of the Encoding with the same
    id, `encode(text)` splits at the same places by itself, five times faster. Only its chunking
    differs (Kimi's cuts runs of over 25,000 characters), so longer texts take the split path.
    """

    CHUNKING_FREE_CHARS = 25_000

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.added = {t.content: i for i, t in tokenizer.added_tokens_decoder.items()}

    @staticmethod
    def applies(tokenizer) -> bool:
        model = tiktoken_model(tokenizer)
        if model is None or getattr(tokenizer, "split_special_tokens", False) or not hasattr(tokenizer, "tokens_trie"):
            return False
        added = tokenizer.added_tokens_decoder
        if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
            return False
        specials = model._special_tokens  # the Encoding's own {text: id}
        if not all(specials.get(t.content) == i for i, t in added.items()):
            return False
        # And its encode(text) must be the plain one (no BOS added, special text matched): probe it
        # against transformers' path on a text that holds an added token.
        probe = "Hi " + next((t.content for t in added.values()), "") + " there"
        return tokenizer.encode(probe) == tokenizer.encode(probe, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        if len(text) <= self.CHUNKING_FREE_CHARS:
            return self.tokenizer.encode(text)
        ids: list[int] = []
        for piece in self.tokenizer.tokens_trie.split(text):
            if not piece:
                continue
            added = self.added.get(piece)
            if added is not None:
                ids.append(added)
            else:
                ids.extend(self.tokenizer.encode(piece))
        return ids
