"""The tokenizer and its vocabulary: loading it offline, ids of token strings, fast batch decoding,
its fingerprint, and the `tiktoken.Encoding` behind a TikToken tokenizer.

May import: `settings` only (every other `tokens` module builds on this one).
"""

import functools
import hashlib
import json
from pathlib import Path

from eagle3_datagen.settings import ModelProfile


def load_tokenizer(profile: ModelProfile):
    """The profile's Hugging Face tokenizer, loaded offline: the class AutoTokenizer would resolve to
    (the one tokenizer_config.json names, or the tokenizer's own code), without AutoTokenizer's import of
    torch (seconds per job); a tokenizer that names no class goes through AutoTokenizer."""
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
        # Its fast class where it names one, else the slow one (Kimi-K2.5's TikTokenTokenizer).
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
    import transformers

    try:
        cls = getattr(transformers, name) if name else None
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
    """`tokenizer.batch_decode`, by the Rust backend's `decode_batch` where that is exactly what it does
    (transformers' own decode methods, no space clean-up), skipping transformers' checks of every id in
    Python (a third of check_parsers' time on long answers)."""
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


def tiktoken_model(tokenizer):
    """The `tiktoken.Encoding` behind a TikToken tokenizer (Kimi's remote code keeps it as `.model`), or None."""
    model = getattr(tokenizer, "model", None)
    return model if type(model).__module__.split(".")[0] == "tiktoken" else None


def whitespace_ids(tokenizer) -> list[int]:
    """The ids whose own text is whitespace only, for the quality gate's `empty_answer`, so that no
    answer is decoded to judge it: a TikToken tokenizer's rank bytes, or else each id decoded alone."""
    model = tiktoken_model(tokenizer)
    if model is not None:
        found = []
        for i in range(model.n_vocab):
            try:
                raw = model.decode_single_token_bytes(i)
            except KeyError:  # an id of no token (a gap between the ranks and the special ids)
                continue
            if raw and raw.isspace() and raw.isascii():
                found.append(i)
        return found
    texts = batch_decode(tokenizer, [[i] for i in range(len(tokenizer))], skip_special_tokens=False)
    return [i for i, text in enumerate(texts) if text and text.isspace()]
