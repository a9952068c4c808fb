"""Typed views of the validated config: the model profile, sampling, client and export settings.

The config is validated against `schemas/config.schema.yaml` before anything reads it; these classes
only give the validated dict names and types, so that library code never indexes raw dicts.
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

# Sampling keys the pipeline sends on every request. SGLang's /generate applies none of the model's
# generation_config defaults, so every one of these is always explicit.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class ModelProfile:
    """What the pipeline must know about the target model and its chat template."""

    name: str
    tokenizer: str
    context_length: int
    trust_remote_code: bool = False
    chat_template_kwargs: dict = field(default_factory=dict)
    prompt_suffix: tuple = ()
    reasoning_end: str | None = None
    stop_tokens: tuple = ()
    prompt_only_tokens: tuple = ()
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    sglang_version: str = "0.5.23"

    @classmethod
    def from_config(cls, model: dict) -> "ModelProfile":
        return cls(
            name=model["name"],
            tokenizer=str(model["tokenizer"]),
            context_length=int(model["context_length"]),
            trust_remote_code=bool(model.get("trust_remote_code", False)),
            chat_template_kwargs=dict(model.get("chat_template_kwargs") or {}),
            prompt_suffix=tuple(model.get("prompt_suffix") or ()),
            reasoning_end=model.get("reasoning_end"),
            stop_tokens=tuple(model.get("stop_tokens") or ()),
            prompt_only_tokens=tuple(model.get("prompt_only_tokens") or ()),
            reasoning_parser=model.get("reasoning_parser"),
            tool_call_parser=model.get("tool_call_parser"),
            sglang_version=str(model.get("sglang_version", "0.5.23")),
        )


@dataclass(frozen=True)
class Budget:
    """How many new tokens a row may ask for (DESIGN §3)."""

    max_new_tokens: int
    min_new_tokens: int = 1
    reserve_tokens: int = 0


@dataclass(frozen=True)
class ClientSettings:
    concurrency: int = 16
    max_retries: int = 5
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    request_timeout_floor_s: float = 60.0
    request_timeout_per_token_s: float = 0.1
    progress_interval_s: float = 10.0

    @classmethod
    def from_config(cls, client: dict | None) -> "ClientSettings":
        return cls(**(client or {}))

    def request_timeout(self, max_new_tokens: int) -> float:
        """A long answer is slow, not stuck: the timeout grows with the row's token budget."""
        return self.request_timeout_floor_s + self.request_timeout_per_token_s * max_new_tokens


def sampling_for(config: dict, category: dict) -> dict:
    """The effective sampling values of one category: global values overridden by the sheet row."""
    sampling = {key: config["sampling"][key] for key in SAMPLING_KEYS}
    for key in ("temperature", "top_p"):
        value = category.get(key)
        if value is not None and value == value:  # NaN marks an empty TSV cell
            sampling[key] = float(value)
    return sampling


def max_new_tokens_for(config: dict, category: dict) -> int:
    value = category.get("max_new_tokens")
    if value is not None and value == value:
        return int(value)
    return int(config["max_new_tokens"])


def stable_hash(obj: Any) -> str:
    """sha256 of an object's canonical JSON: the same value always hashes the same."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()

