"""One request's sampling parameters, as SGLang 0.5.23 builds and checks them
(`srt/sampling/sampling_params.py`: defaults, `__post_init__`, `normalize`, the greedy rule, `verify()`).

Imports `protocol.errors` only.
"""

import dataclasses
import math
from typing import Any

from eagle3_datagen.engine.protocol.errors import value_error

TOP_K_ALL = 1 << 30
SAMPLING_EPS = 1e-6
MAX_STOP_COUNT = 32

# Defaults of `SamplingParams` in srt/sampling/sampling_params.py (top_k -1 is stored as TOP_K_ALL).
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "stream_interval": None,
    "logit_bias": None,
    "sampling_seed": None,
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
    "choice": None,
}


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters after SGLang's `__post_init__` and `normalize`."""

    max_new_tokens: int | None = 128
    stop_strs: tuple[str, ...] = ()
    stop_token_ids: frozenset = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        """SGLang samples greedily when top_k is 1 (temperature < 1e-6 sets it)."""
        return self.top_k == 1

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None) -> "SamplingParams":
        """Build from the request's dict: None means default, as in `__post_init__`."""
        raw = dict(raw or {})
        d = {k: v for k, v in SAMPLING_DEFAULTS.items()}
        for k, v in raw.items():
            if v is not None or k == "max_new_tokens":
                d[k] = v
        if "max_new_tokens" not in raw:
            d["max_new_tokens"] = 128
        stop = d["stop"]
        stop_strs = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if len(stop_strs) > MAX_STOP_COUNT:
            raise value_error(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stop_strs)}")
        stop_ids = frozenset(int(t) for t in (d["stop_token_ids"] or ()) if t is not None)
        # Numbers stay as the JSON had them (SGLang's constructor converts none): the texts of
        # `verify` print an integer as one ("got -1.", not "got -1.0.").
        temperature = d["temperature"]
        top_k = int(d["top_k"])
        if 0 <= temperature < SAMPLING_EPS:
            temperature, top_k = 1.0, 1
        if top_k == -1:
            top_k = TOP_K_ALL
        return cls(
            max_new_tokens=d["max_new_tokens"],
            stop_strs=stop_strs,
            stop_token_ids=stop_ids,
            temperature=temperature,
            top_p=d["top_p"],
            top_k=top_k,
            min_p=d["min_p"],
            frequency_penalty=d["frequency_penalty"],
            presence_penalty=d["presence_penalty"],
            repetition_penalty=d["repetition_penalty"],
            min_new_tokens=int(d["min_new_tokens"]),
            n=int(d["n"]),
            ignore_eos=bool(d["ignore_eos"]),
            skip_special_tokens=bool(d["skip_special_tokens"]),
            spaces_between_special_tokens=bool(d["spaces_between_special_tokens"]),
            no_stop_trim=bool(d["no_stop_trim"]),
            logit_bias=d["logit_bias"] or None,
            sampling_seed=d["sampling_seed"],
        )

    def verify(self, vocab_size: int) -> None:
        """`SamplingParams.verify`: the same checks and texts (ValueError → HTTP 400)."""
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise value_error(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise value_error(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise value_error(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 or self.top_k == -1:
            raise value_error(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise value_error(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise value_error(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise value_error(
                f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}."
            )
        if not 0 <= self.min_new_tokens:
            raise value_error(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise value_error(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if not self.min_new_tokens <= self.max_new_tokens:
                raise value_error(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}."
                )
        if self.logit_bias is not None:
            for token_id in self.logit_bias:
                if not 0 <= int(token_id) < vocab_size:
                    raise value_error(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise value_error(f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}.")
