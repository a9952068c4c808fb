"""Client-side chat templating: the model's own template, rendered and tokenized here, never on the server.

`tokenize_conversations` is `apply_chat_template(add_generation_prompt=True)` done in batches (a batch
takes one `tools` argument, so rows are grouped by their tools) as Jinja rendering followed by one
`encode_batch` of the rendered strings: the same ids as `apply_chat_template(tokenize=True)`, at the
speed of the bare tokenizer.

Control-token policy ("literal-as-text"): text inside a system, user or tool message that spells a
control token (a user asking about `<|im_end|>`) must not become that token. Such spans are cut out before rendering and
encoded as plain text, in isolation — the same segment boundaries an added token would have made.
"""

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.settings import Budget, ModelProfile

CONTROL_TOKEN_POLICY = "literal-as-text"
# Private-use characters mark where literal control text was cut out of a message.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARK_RE = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


def load_tokenizer(profile: ModelProfile):
    """The profile's Hugging Face tokenizer, loaded offline.

    The class named in tokenizer_config.json is loaded directly when transformers exports it, and a
    tokenizer's own code (auto_map, with trust_remote_code) through transformers' dynamic-module
    loader: each is what AutoTokenizer resolves to as well, without AutoTokenizer's import of torch
    (seconds per job, and on a generate job's path). A tokenizer that names no class goes through
    AutoTokenizer.
    """
    path = Path(profile.tokenizer)
    if not path.exists():
        raise FileNotFoundError(f"model.tokenizer: tokenizer directory {path} does not exist")
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    auto_map = config.get("auto_map") or {}
    if not profile.trust_remote_code and "AutoTokenizer" in auto_map:
        # transformers may quietly fall back to a built-in class instead of the tokenizer's own code,
        # which would tokenize differently from the model: refuse instead.
        raise ValueError(
            f"model.tokenizer: {path} ships its own tokenizer code ({auto_map['AutoTokenizer']}); "
            "set model.trust_remote_code: true in the config if you trust it"
        )
    if "AutoTokenizer" in auto_map:
        # The tokenizer's own code (Kimi-K2.5's TikTokenTokenizer), resolved as AutoTokenizer does
        # (its fast class where it names one, else the slow one), without AutoTokenizer's torch.
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        ref = auto_map["AutoTokenizer"]
        if isinstance(ref, (list, tuple)):
            ref = ref[1] if len(ref) > 1 and ref[1] else ref[0]
        return get_class_from_dynamic_module(ref, str(path)).from_pretrained(str(path), trust_remote_code=True)
    cls = _exported_class(config.get("tokenizer_class"))
    if cls is None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=profile.trust_remote_code)
    return cls.from_pretrained(str(path))


def _exported_class(name: str | None):
    """The tokenizer class transformers exports under `name` (e.g. Qwen2Tokenizer), or None."""
    if not name:
        return None
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else None


def token_id(tokenizer, token: str) -> int:
    """The id of one token string, read from the tokenizer; an unknown token is an error, not unk."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(f"token {token!r} is not in the vocabulary of the tokenizer")
    return int(tid)


def token_ids(tokenizer, tokens) -> list[int]:
    return [token_id(tokenizer, t) for t in tokens]


def batch_decode(tokenizer, sequences: list[list[int]], *, skip_special_tokens: bool) -> list[str]:
    """`tokenizer.batch_decode`, by the Rust backend's `decode_batch` where that is exactly what it
    does: a fast tokenizer whose class keeps transformers' own decode methods and cleans up no
    spaces. transformers first checks every id in Python, twice (a third of check_parsers' time on
    long answers); anything else takes the tokenizer's own path."""
    if _plain_fast_decode(type(tokenizer)) and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.backend_tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens)
    return tokenizer.batch_decode(sequences, skip_special_tokens=skip_special_tokens)


@functools.lru_cache(maxsize=16)
def _plain_fast_decode(cls) -> bool:
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return (
        issubclass(cls, TokenizersBackend)
        and cls._decode is TokenizersBackend._decode
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls.batch_decode is PreTrainedTokenizerBase.batch_decode
    )


def tokenizer_fingerprint(tokenizer) -> dict:
    """sha256 of the tokenizer's vocabulary and of its chat template, for provenance and caching."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab_blob = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = json.dumps(template, sort_keys=True)
    return {
        "tokenizer_sha256": hashlib.sha256(vocab_blob.encode("utf-8")).hexdigest(),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "vocab_size": len(tokenizer),
    }


# Turn-final markers that SGLang 0.5.23 adds to a tokenizer's stop ids wherever its added vocabulary
# holds them (`utils/hf_transformers/common.py`, `_ADDITIONAL_STOP_TOKEN_TEXTS`).
SGLANG_ADDITIONAL_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")
MODEL_CONFIG_FILES = ("config.json", "generation_config.json")


@dataclass(frozen=True)
class StopSet:
    """Every id a SGLang server stops a request on, and where each came from.

    `sources` maps what named them (`model.stop_tokens`, `tokenizer.eos_token`, `config.json`,
    `generation_config.json`, `additional_stop_tokens`) to their ids, and to None for a model file
    that is missing beside the tokenizer: then only the rest is known."""

    ids: frozenset
    sources: dict

    def to_json(self) -> dict:
        return {"ids": sorted(self.ids), "sources": self.sources}


def _eos_ids_of(path: Path) -> list[int] | None:
    """`eos_token_id` of a model config file (an int or a list of them); None where the file is missing."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: cannot be read as a model config ({exc})") from None
    if value is None:
        return []
    values = [value] if isinstance(value, int) else value
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{path}: eos_token_id must be an integer or a list of integers, not {value!r}")
    return sorted(set(values))


def stop_set(tokenizer, profile: ModelProfile) -> StopSet:
    """The ids the server will stop on, as SGLang 0.5.23 decides (`Req._check_token_based_finish`):
    the request's `stop_token_ids` (the profile's `stop_tokens`), the model's `eos_token_id`s from
    config.json and generation_config.json (`ModelConfig._get_hf_eos_token_id`), the tokenizer's
    eos, and the additional turn-final markers its added vocabulary holds.

    The model files are read beside the tokenizer (`model.tokenizer`, the model's own folder):
    Kimi-K2.5's tokenizer eos is `[EOS]` while its turns end with `<|im_end|>`, so an answer can end
    on either, and every check and the chat layer's trimming must know both."""
    sources: dict = {"model.stop_tokens": token_ids(tokenizer, profile.stop_tokens)}
    eos = tokenizer.eos_token_id
    if eos is not None:
        sources["tokenizer.eos_token"] = [int(eos)]
    folder = Path(profile.tokenizer)
    for name in MODEL_CONFIG_FILES:
        sources[name] = _eos_ids_of(folder / name)
    added = tokenizer.get_added_vocab()
    extra = sorted(added[text] for text in SGLANG_ADDITIONAL_STOP_TEXTS if text in added)
    if extra:
        sources["additional_stop_tokens"] = extra
    ids = frozenset(i for found in sources.values() for i in found or ())
    return StopSet(ids, sources)


def token_facts(tokenizer, profile: ModelProfile) -> dict:
    """What the later steps need to know of the tokenizer, read once by tokenize_prompts.

    Planning, generation and the figures take these from the prompts table's provenance instead of
    loading the tokenizer again; ids are read from the tokenizer, never hard-coded.
    """
    return {
        **tokenizer_fingerprint(tokenizer),
        # Sent as the request's stop_token_ids; the server stops on `stop_set` (these and the model's eos).
        "stop_token_ids": token_ids(tokenizer, profile.stop_tokens),
        "stop_set": stop_set(tokenizer, profile).to_json(),
        "prompt_suffix_ids": token_ids(tokenizer, profile.prompt_suffix),
        "prompt_only_ids": token_ids(tokenizer, profile.prompt_only_tokens),
        "reasoning_end_id": token_id(tokenizer, profile.reasoning_end) if profile.reasoning_end else None,
    }


def tiktoken_model(tokenizer):
    """The `tiktoken.Encoding` behind a TikToken tokenizer (Kimi's remote code keeps it as `.model`), or None."""
    model = getattr(tokenizer, "model", None)
    if model is None or type(model).__module__.split(".")[0] != "tiktoken":
        return None
    return model


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


def output_budget(n_prompt_tokens: int, *, context_length: int, budget: Budget) -> tuple[int, str | None]:
    """max_new_tokens = min(configured, context − prompt − reserve); a reason when it is too small.

    SGLang answers HTTP 400 when prompt + max_new_tokens exceeds the context, so the budget is cut
    here rather than discovered there.
    """
    room = context_length - n_prompt_tokens - budget.reserve_tokens
    value = min(budget.max_new_tokens, room)
    if value < budget.min_new_tokens:
        return max(value, 0), (
            f"over-long: the prompt has {n_prompt_tokens} tokens; context_length {context_length} "
            f"(reserve {budget.reserve_tokens}) leaves {max(room, 0)} new tokens, "
            f"fewer than min_new_tokens {budget.min_new_tokens}"
        )
    return value, None
