"""Text to ids outside the chat template: spans that spell a control token (`ControlText`), text
encoded with no added-token matching (`TextOnlyEncoder`), and a TikToken tokenizer's fast path
(`TiktokenPath`).

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
        strings = control_strings(tokenizer)
        self._by_first: dict[str, list[str]] = {}
        for s in sorted(strings, key=len, reverse=True):  # longest match wins
            self._by_first.setdefault(s[0], []).append(s)
        self._lengths = {c: sorted({len(s) for s in group}, reverse=True) for c, group in self._by_first.items()}
        self._sets = {c: set(group) for c, group in self._by_first.items()}
        self._first_re = (
            re.compile("[" + "".join(re.escape(c) for c in self._by_first) + "]") if self._by_first else None
        )

    def spans(self, text: str) -> list[tuple[int, int]]:
        if self._first_re is None or not text:
            return []
        found = []
        pos = 0
        while True:
            m = self._first_re.search(text, pos)
            if m is None:
                return found
            start = m.start()
            first = text[start]
            for length in self._lengths[first]:
                if text[start : start + length] in self._sets[first]:
                    found.append((start, start + length))
                    pos = start + length
                    break
            else:
                pos = start + 1


class TextOnlyEncoder:
    """Encodes text with no added- or special-token matching: what a control string typed by a user becomes.

    Fast tokenizers: the path the tokenizer takes for any text between added tokens (normalizer,
    pre-tokenizer, model) run on the whole string, so no added token can match inside it. TikToken
    tokenizers: the Encoding's ordinary encoding with special tokens disallowed as specials (what Kimi's
    `encode(text, allow_special_tokens=False)` gives).
    """

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tiktoken = tiktoken_model(tokenizer) if backend is None else None
        if backend is None and self._tiktoken is None:
            raise NotImplementedError(
                f"literal control text needs a fast tokenizer (tokenizer.json) or a TikToken one; {type(tokenizer).__name__} is neither"
            )
        if backend is not None:
            self._normalizer = backend.normalizer
            self._pre_tokenizer = backend.pre_tokenizer
            self._model = backend.model

    def encode(self, text: str) -> list[int]:
        if self._tiktoken is not None:
            return self._tiktoken.encode(text, disallowed_special=())
        if self._normalizer is not None:
            text = self._normalizer.normalize_str(text)
        pieces = self._pre_tokenizer.pre_tokenize_str(text) if self._pre_tokenizer is not None else [(text, None)]
        return [token.id for piece, _ in pieces for token in self._model.tokenize(piece)]


class TiktokenPath:
    """The ids of a slow TikToken tokenizer's own path, at the speed of its own `encode`.

    transformers' slow `encode(text, add_special_tokens=False)` (what `apply_chat_template` calls) splits
    the text on the added tokens and tokenizes each piece between them with `_tokenize`, which for a
    TikToken tokenizer is its own `encode(piece)` mapped to token strings and back. When every added
    token is also a special token of the Encoding, with the same id, the tokenizer's `encode(text)`
    splits at the same places by itself: it gives the same ids for the whole text at once, five times
    faster than the split (a Python trie) and the per-piece calls. The one exception is chunking
    inside `encode`: Kimi's cuts runs of over 25,000 whitespace or non-whitespace characters (and
    calls of over 400,000), and a cut may fall elsewhere for the whole text than for its pieces, so
    texts longer than that take the split path.
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
