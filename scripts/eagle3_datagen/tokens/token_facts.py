"""What a request is sent with besides its prompt ids: the stop set (every id SGLang stops on), the
output budget, and the token facts the prompts table carries so that later steps never load the tokenizer.

May import: `settings`, `tokens.vocabulary`.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.settings import Budget, ModelProfile
from eagle3_datagen.tokens.vocabulary import token_id, token_ids, tokenizer_fingerprint, whitespace_ids

# Turn-final markers that SGLang 0.5.23 adds to a tokenizer's stop ids wherever its added vocabulary
# holds them (`utils/hf_transformers/common.py`, `_ADDITIONAL_STOP_TOKEN_TEXTS`).
SGLANG_ADDITIONAL_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")
MODEL_CONFIG_FILES = ("config.json", "generation_config.json")


@dataclass(frozen=True)
class StopSet:
    """Every id a SGLang server stops a request on; `sources` maps what named them (`model.stop_tokens`,
    `config.json`, ...) to their ids, or to None for a model file missing beside the tokenizer."""

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
    """The ids the server will stop on, as SGLang 0.5.23 decides (`Req._check_token_based_finish`): the
    profile's `stop_tokens`, the `eos_token_id`s of config.json and generation_config.json beside the
    tokenizer, the tokenizer's eos, and the additional turn-final markers its vocabulary holds. Kimi-K2.5's
    tokenizer eos is `[EOS]` while its turns end with `<|im_end|>`: an answer can end on either."""
    sources: dict = {"model.stop_tokens": token_ids(tokenizer, profile.stop_tokens)}
    if profile.eos_tokens:
        sources["model.eos_tokens"] = token_ids(tokenizer, profile.eos_tokens)
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
    """What the later steps need to know of the tokenizer, read once by tokenize_prompts: they take it
    from the prompts table's provenance instead of loading the tokenizer again."""
    return {
        **tokenizer_fingerprint(tokenizer),
        # Sent as the request's stop_token_ids: the turn ends and the eos the profile names; the server
        # stops on `stop_set` (these and the model files' eos). Only the turn ends end a turn normally.
        "stop_token_ids": token_ids(tokenizer, profile.stop_tokens + profile.eos_tokens),
        "turn_end_ids": token_ids(tokenizer, profile.stop_tokens),
        "stop_set": stop_set(tokenizer, profile).to_json(),
        "prompt_suffix_ids": token_ids(tokenizer, profile.prompt_suffix),
        "prompt_only_ids": token_ids(tokenizer, profile.prompt_only_tokens),
        "reasoning_start_id": optional_id(tokenizer, profile.reasoning_start),
        "reasoning_end_id": token_id(tokenizer, profile.reasoning_end) if profile.reasoning_end else None,
        # For the quality gate's empty_answer: read from the vocabulary, never from decoded answers.
        "whitespace_ids": whitespace_ids(tokenizer),
    }


def optional_id(tokenizer, token: str | None) -> int | None:
    """The id of a token the tokenizer may lack (model.reasoning_start's default), or None."""
    if not token:
        return None
    try:
        return token_id(tokenizer, token)
    except (KeyError, ValueError):
        return None


def output_budget(n_prompt_tokens: int, *, context_length: int, budget: Budget) -> tuple[int, str | None]:
    """max_new_tokens = min(configured, context − prompt − reserve), a reason when it is too small:
    SGLang answers HTTP 400 when prompt + max_new_tokens exceeds the context."""
    room = context_length - n_prompt_tokens - budget.reserve_tokens
    value = min(budget.max_new_tokens, room)
    if value < budget.min_new_tokens:
        return max(value, 0), (
            f"over-long: the prompt has {n_prompt_tokens} tokens; context_length {context_length} "
            f"(reserve {budget.reserve_tokens}) leaves {max(room, 0)} new tokens, "
            f"fewer than min_new_tokens {budget.min_new_tokens}"
        )
    return value, None
