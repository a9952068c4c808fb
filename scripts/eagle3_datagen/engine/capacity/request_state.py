"""A request as the simulated scheduler tracks it (`SchedReq`), and what the scheduler reports:
a request's numbers when it leaves (`RequestStats`) and the last step (`StepInfo`).

Imports nothing of the engine.
"""

import dataclasses
from collections.abc import Hashable


@dataclasses.dataclass
class RequestStats:
    """What the scheduler knows of a request when it leaves (finished, aborted or refused).

    Times are the scheduler's virtual seconds (None: not reached yet); `queue_time` is a duration.
    `output_len` is the number of tokens generated (all of them when it finished). `error` and
    `status_code` are set when the scheduler itself ended the request (a prompt too long, out of
    memory).
    """

    key: Hashable
    prompt_len: int
    output_len: int
    max_new_tokens: int
    cached_tokens: int = 0
    num_retractions: int = 0
    queue_time: float = 0.0
    arrival_time: float = 0.0
    forward_entry_time: float | None = None
    prefill_finished_time: float | None = None
    finish_time: float = 0.0
    error: str | None = None
    status_code: int | None = None


@dataclasses.dataclass
class StepInfo:
    """The last step: `kind` is "prefill", "decode" or "idle"; keys admitted, retracted, finished."""

    kind: str = "idle"
    seconds: float = 0.0
    batch_size: int = 0
    extend_tokens: int = 0
    kv_tokens: int = 0
    admitted: list = dataclasses.field(default_factory=list)
    retracted: list = dataclasses.field(default_factory=list)
    finished: list = dataclasses.field(default_factory=list)


class SchedReq:
    """One request inside the scheduler: its lengths, progress, the KV it holds and the cache pages it pins."""

    __slots__ = (
        "key", "prompt_ids", "prompt_len", "output_ids", "output_len", "max_new", "ignore_eos",
        "generated", "kv_len", "private", "pages", "hashes", "extend", "prefix", "stats", "wait_since",
        "stained",
    )  # fmt: skip

    def __init__(self, key, prompt_ids, prompt_len, output_ids, output_len, max_new, ignore_eos, now):
        self.key = key
        self.prompt_ids = prompt_ids
        self.prompt_len = prompt_len
        self.output_ids = output_ids
        self.output_len = output_len
        self.max_new = max_new
        self.ignore_eos = ignore_eos
        self.generated = 0  # output tokens so far
        self.kv_len = 0  # tokens whose KV this request holds (0 while waiting)
        self.private = 0  # of those, tokens not in cache pages
        self.pages: list[int] = []  # cache pages it pins: a prefix of its sequence
        self.hashes: list[int] = []  # page keys of its known tokens, computed as needed
        self.extend = 0
        self.prefix = 0
        self.stained = False  # retracted once: later prefills do not count cache hits
        self.wait_since = now
        self.stats = RequestStats(key, prompt_len, 0, max_new, arrival_time=now)

    @property
    def fill_len(self) -> int:
        return self.prompt_len + self.generated

    def known_len(self) -> int:
        """Tokens of its sequence whose ids are known (for the cache): the prompt, and outputs if given."""
        if self.prompt_ids is None:
            return 0
        return self.prompt_len + (self.generated if self.output_ids is not None else 0)
