"""The duration of one forward pass of the simulated GPU (`StepModel`).

A step takes `base_ms + per_request_ms * batch_size` ms `+ per_kv_token_us * kv_tokens +
prefill_per_token_us * extend_tokens` us, where `kv_tokens` is the KV the batch's requests hold and
`extend_tokens` the tokens a prefill computes (0 in a decode step).

Imports nothing of the engine.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class StepModel:
    """The duration of one forward pass, linear in its batch size, KV read and prefill tokens."""

    base_ms: float = 2.0
    per_request_ms: float = 0.02
    per_kv_token_us: float = 0.0
    prefill_per_token_us: float = 0.5

    def seconds(self, batch_size: int, kv_tokens: int, extend_tokens: int) -> float:
        ms = self.base_ms + self.per_request_ms * batch_size
        us = self.per_kv_token_us * kv_tokens + self.prefill_per_token_us * extend_tokens
        return ms / 1e3 + us / 1e6
