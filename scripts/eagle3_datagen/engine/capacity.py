"""A simulated GPU: SGLang 0.5.23's scheduler in virtual time, as a pure object (no threads, no clock).

`KVScheduler` models what decides a request's latency on a real server: how many requests run at
once, the KV-cache budget, the admission estimate, retraction when decode runs out of KV, and the
prefix cache. Each `step()` is one forward pass and returns the requests it finished and the
pass's duration from a linear step-time model; the caller advances time (the local engine sleeps
that long, a test just counts). The rules follow these places in SGLang 0.5.23
(`python/sglang/srt/`):

- `managers/scheduler.py` `get_next_batch_to_run`: a step is a prefill batch when one can be
  formed, else a decode step of every running request (mixed chunked prefill off, its default).
  A prefill gives each admitted request its first token; a decode step one token per request.
- `managers/scheduler.py` `_get_new_batch_prefill_raw` and `managers/schedule_policy.py`
  `PrefillAdder` (`add_one_req`, `_select_prefill_admission`, `budget_state`) with
  `mem_cache/prefill_budget.py` `PrefillBudget`: FIFO waiting queue (`--schedule-policy fcfs`, the
  default, does not reorder it); a request is admitted while fewer than `max_running_requests` run
  and `extend + min(max_new_tokens - generated, CLIP) + page_size < available + evictable -
  offset`, where the offset holds every running request's `min(remaining, CLIP) * new_token_ratio`
  (ratio 1.0 under `ignore_eos`, `_get_running_request_total_token_offset`) and every request
  admitted earlier in the pass (`reserve`: its extend + a page + `min(max_new_tokens, CLIP)`, not
  scaled by the ratio). Admission stops at the first request that does not fit (`batch_is_full`
  until a request leaves) and, chunked prefill off, once a batch holds `max_prefill_tokens` of
  extend (the first request always goes).
- `managers/scheduler_components/new_token_ratio_tracker.py`: the ratio starts at
  `min(SGLANG_INIT_NEW_TOKEN_RATIO 0.7 * schedule_conservativeness, 1)`, loses
  `(init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS 600` per decode step down to `init *
  SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14`, is re-estimated after a retraction
  (`estimate_new_token_ratio_after_retract`: `(decoded + SGLANG_RETRACT_DECODE_STEPS 20 * n) /
  (sum max_new_tokens + 1)` over the requests kept, at most 1), and is reset to its initial value
  when the scheduler is fully idle (`scheduler.on_idle`).
- `managers/scheduler.py` `update_running_batch` and `managers/schedule_batch.py`
  `check_decode_mem`, `retract_decode`, `release_req`, `Req.reset_for_retract`: before a decode
  step that needs more KV than is free after evicting the cache, requests are retracted, the one
  with the fewest output tokens first (ties: the longest prompt), until the step fits; at least one
  is kept (and aborted with HTTP 500 if even it does not fit). A retracted request frees its KV
  (its prompt pages stay in the cache, unpinned), goes to the back of the waiting queue with its
  output tokens kept (`reset_for_retract` drops them only for `input_embeds`) and, when admitted
  again, prefills prompt + output (`full_untruncated_fill_ids`), less what the cache still holds.
- Prefix cache (the radix cache, `mem_cache/common.py` `checkpoint_kv_cache`, `release_kv_cache`):
  a prompt is inserted once prefilled, the whole sequence once finished; cached tokens not pinned
  by a running request are evictable, least recently used first. Here the cache is kept in pages
  of `cache_page_size` tokens keyed by a hash of the whole prefix up to the page's end (SGLang's
  tree matches to the token, with `page_size` 1); a prompt's `cached_tokens` is its longest cached
  page-aligned prefix, at most `len - 1` tokens (`_compute_max_prefix_len`), counted once: a
  retracted request's second prefill does not add to it (`retracted_stain`).
- Queue time (`observability/req_time_stats.py` `set_wait_queue_entry_time`,
  `set_forward_entry_time`): the time from entering the waiting queue to the start of the prefill
  that admits it, summed over every stay (after each retraction too).
- Limits (`managers/scheduler.py` `init_req_max_new_tokens`, `tp_worker.get_worker_info`,
  `managers/utils.py` `validate_input_length`): `max_req_len = min(context - 1, max_total_tokens -
  1)`, `max_new_tokens` is clipped to `max_req_len - input - 1` and to the empty pool,
  `max_total_tokens - ceil_page(input) - page_size - 1`; a prompt of `max_req_len - 5` tokens or more
  is refused.

A step takes `base_ms + per_request_ms * batch_size` ms `+ per_kv_token_us * kv_tokens +
prefill_per_token_us * extend_tokens` us, where `kv_tokens` is the KV the batch's requests hold and
`extend_tokens` the tokens a prefill computes (0 in a decode step).
"""

import collections
import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

# SGLang 0.5.23's defaults: srt/environ.py (envs) and srt/arg_groups/fields/schedule.py (flags).
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, schedule_policy.CLIP_MAX_NEW_TOKENS
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens
DECODE_LOG_INTERVAL = 40  # --decode-log-interval: the window of gen_throughput
GEN_THROUGHPUT_STALENESS_S = 30.0  # metrics_reporter.GEN_THROUGHPUT_STALENESS_SECONDS
STEP_MAX_US = 2_000_000  # scheduler.STEP_MAX_US: longer decode gaps are not decode cadence

OOM_MESSAGE = "Out of memory even after retracting all other requests in the decode batch. Aborting the last request."


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


class _Req:
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


class KVScheduler:
    """SGLang 0.5.23's scheduling of one DP rank in virtual time (see the module docstring).

    `add` queues a request whose prompt and output lengths are known in advance (the caller has
    made the answer); `step` runs one forward pass; `abort` takes a request out; `load` is the
    rank's `/v1/loads` entry. Keys are any hashable; times are virtual seconds (`clock`), moved by
    `step` and `advance`.
    """

    def __init__(
        self,
        max_running_requests: int,
        max_total_tokens: int,
        *,
        step_model: StepModel | None = None,
        context_length: int | None = None,
        page_size: int = 1,
        cache_page_size: int = 16,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        schedule_conservativeness: float = 1.0,
        prefix_cache: bool = True,
        clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS,
    ):
        if max_running_requests < 1 or max_total_tokens < 1:
            raise ValueError("max_running_requests and max_total_tokens must be positive")
        self.max_running_requests = max_running_requests
        self.max_total_tokens = max_total_tokens
        self.step_model = step_model or StepModel()
        self.page_size = page_size
        self.cache_page_size = cache_page_size
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = prefix_cache
        # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the most new tokens admission reserves per request;
        # answers longer than it are what fills the KV cache past the estimate (retractions).
        self.clip = clip_max_new_tokens
        context = context_length if context_length is not None else max_total_tokens
        self.max_req_len = min(context - 1, max_total_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        # NewTokenRatioTracker.from_config
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio

        self.clock = 0.0
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self._reqs: dict[Hashable, _Req] = {}
        self._refused: list[RequestStats] = []
        self.batch_is_full = False
        self.last_step = StepInfo()
        # KV accounting: private tokens of running requests + cache pages (pinned or evictable)
        self._private = 0
        self._pages: dict[int, int] = {}  # page key -> number of requests pinning it
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # unpinned pages, oldest first
        # load metrics (load_inquirer.get_loads)
        self.cache_hit_rate = 0.0
        self._hit_tokens = 0
        self._input_tokens = 0
        self.total_prefill_uncached_tokens = 0
        self.total_prefill_busy_us = 0
        self.decode_moments = [0.0] * 6
        self._last_kind = "idle"
        self.gen_throughput = 0.0
        self._decode_ct = 0
        self._decode_tokens = 0
        self._decode_tic = 0.0
        self.last_retracted = 0
        self.num_retractions_total = 0

    # -- limits
    def clip_max_new_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """`init_req_max_new_tokens`: the budget a request of `prompt_len` tokens really gets."""
        paged = -(-prompt_len // self.page_size) * self.page_size
        return max(
            0,
            min(max_new_tokens, self.max_req_len - prompt_len - 1, self.max_total_tokens - paged - self.page_size - 1),
        )

    def input_too_long(self, prompt_len: int) -> str | None:
        """`validate_input_length`'s refusal text for a prompt this pool cannot take, or None."""
        if prompt_len >= self.max_req_input_len:
            return (
                f"Input length ({prompt_len} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
            )
        return None

    # -- KV accounting
    @property
    def cached_tokens_total(self) -> int:
        return len(self._pages) * self.cache_page_size

    @property
    def evictable_tokens(self) -> int:
        return len(self._lru) * self.cache_page_size

    @property
    def available_tokens(self) -> int:
        return self.max_total_tokens - self._private - self.cached_tokens_total

    @property
    def used_tokens(self) -> int:
        """`pool_stats_observer._get_token_info`: the pool less what is free or evictable."""
        return self.max_total_tokens - self.available_tokens - self.evictable_tokens

    def _evict_to(self, num_tokens: int) -> None:
        """`evict_to_free_tokens`: evict unpinned pages, least recently used first, until `num_tokens` are free."""
        while self.available_tokens < num_tokens and self._lru:
            key, _ = self._lru.popitem(last=False)
            del self._pages[key]

    def _alloc(self, req: _Req, n: int) -> bool:
        self._evict_to(n)
        if self.available_tokens < n:
            return False
        req.private += n
        req.kv_len += n
        self._private += n
        return True

    def _pin(self, keys: Sequence[int]) -> None:
        for key in keys:
            if self._pages[key] == 0:
                del self._lru[key]
            self._pages[key] += 1

    def _unpin(self, keys: Sequence[int]) -> None:
        # Deepest page first, so that a parent is always more recent than its children and the
        # cache evicts from the leaves, as a radix tree does.
        for key in reversed(keys):
            self._pages[key] -= 1
            if self._pages[key] == 0:
                self._lru[key] = None

    def _hashes(self, req: _Req, n_pages: int) -> list[int]:
        """The page keys of `req`'s first `n_pages` pages: a hash of the whole prefix up to each page's end."""
        hashes = req.hashes
        if len(hashes) < n_pages:
            seq = req.prompt_ids
            if req.output_ids is not None and n_pages * self.cache_page_size > req.prompt_len:
                seq = list(req.prompt_ids) + list(req.output_ids[: req.generated])
            p = self.cache_page_size
            h = hashes[-1] if hashes else 0
            for i in range(len(hashes), n_pages):
                h = hash((h, tuple(seq[i * p : (i + 1) * p])))
                hashes.append(h)
        return hashes[:n_pages]

    def _match(self, req: _Req) -> list[int]:
        """The longest cached page-aligned prefix of `req`'s fill ids, leaving at least one token to compute."""
        if not self.prefix_cache:
            return []
        limit = min(req.known_len(), req.fill_len - 1) // self.cache_page_size
        matched: list[int] = []
        for key in self._hashes(req, limit):
            if key not in self._pages:
                break
            matched.append(key)
        return matched

    def _publish(self, req: _Req) -> None:
        """Insert `req`'s computed full pages into the cache (pinned by it); duplicates free its copy."""
        if not self.prefix_cache:
            return
        n = min(req.kv_len, req.known_len()) // self.cache_page_size
        if n <= len(req.pages):
            return
        p = self.cache_page_size
        for key in self._hashes(req, n)[len(req.pages) :]:
            if key in self._pages:
                if self._pages[key] == 0:
                    del self._lru[key]
                self._pages[key] += 1
            else:
                self._pages[key] = 1
            req.private -= p
            self._private -= p
            req.pages.append(key)

    def _release(self, req: _Req, *, publish: bool) -> None:
        """`release_kv_cache`: optionally insert the sequence, unpin its pages, free the rest."""
        if publish:
            self._publish(req)
        self._unpin(req.pages)
        self._private -= req.private
        req.private = 0
        req.kv_len = 0
        req.pages = []

    # -- requests
    def add(
        self,
        key: Hashable,
        prompt_len: int,
        output_len: int,
        max_new_tokens: int,
        *,
        prompt_ids: Sequence[int] | None = None,
        output_ids: Sequence[int] | None = None,
        ignore_eos: bool = False,
    ) -> None:
        """Queue a request that will generate `output_len` tokens (at most its clipped `max_new_tokens`).

        `prompt_ids`/`output_ids` make its pages cacheable; without `prompt_ids` it never hits nor
        fills the cache. A prompt the pool cannot take is refused: it comes back from the next
        `step` with `error` set (HTTP 400).
        """
        if key in self._reqs:
            raise ValueError(f"duplicate key {key!r}")
        max_new = self.clip_max_new_tokens(prompt_len, max_new_tokens)
        output_len = max(1, min(output_len, max_new))
        if prompt_ids is not None and len(prompt_ids) != prompt_len:
            raise ValueError("prompt_ids and prompt_len disagree")
        req = _Req(key, prompt_ids, prompt_len, output_ids, output_len, max_new, ignore_eos, self.clock)
        error = self.input_too_long(prompt_len)
        if error is not None:
            req.stats.error, req.stats.status_code = error, 400
            req.stats.finish_time = self.clock
            self._refused.append(req.stats)
            return
        self._reqs[key] = req
        self.waiting.append(req)

    def abort(self, key: Hashable) -> RequestStats | None:
        """Take a request out, waiting or running; its KV is freed (what it computed stays cached)."""
        req = self._reqs.pop(key, None)
        if req is None:
            return None
        if req in self.running:
            self.running.remove(req)
            self._release(req, publish=True)
            self.batch_is_full = False
        else:
            self.waiting.remove(req)
        return self._stats(req)

    def progress(self, key: Hashable) -> int:
        """Output tokens generated so far (0 for an unknown key)."""
        req = self._reqs.get(key)
        return req.generated if req is not None else 0

    def advance(self, seconds: float) -> None:
        """Let time pass without a forward pass (a caller that keeps virtual time in step with a real clock)."""
        if seconds > 0:
            self.clock += seconds

    def flush_cache(self) -> bool:
        """`/flush_cache`: drop every cached page, only when nothing is running or waiting."""
        if self.running or self.waiting:
            return False
        self._pages.clear()
        self._lru.clear()
        return True

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self._refused)

    def _stats(self, req: _Req) -> RequestStats:
        st = req.stats
        st.output_len = req.generated
        st.finish_time = self.clock
        return st

    # -- one forward pass
    def step(self) -> tuple[list[RequestStats], float]:
        """Run one forward pass: a prefill batch if one can be formed, else a decode step.

        Returns the requests that left during it (finished, or ended by the scheduler) and its
        duration in seconds; the clock has moved on by that much.
        """
        info = StepInfo()
        left = self._refused
        self._refused = []
        batch = self._schedule_prefill()
        if batch:
            left += self._run_prefill(batch, info)
        elif self.running:
            left += self._run_decode(info)
        elif not self.waiting:
            self.new_token_ratio = self.init_new_token_ratio  # on_idle: fully idle
        info.finished = [st.key for st in left]
        self.last_step = info
        self._last_kind = info.kind
        return left, info.seconds

    def _schedule_prefill(self) -> list[_Req]:
        """`_get_new_batch_prefill_raw` with a `PrefillAdder`, chunked prefill off."""
        if not self.running:
            self.batch_is_full = False
        if self.batch_is_full or not self.waiting:
            return []
        running_bs = len(self.running)
        allocatable = self.max_running_requests - running_bs
        if allocatable <= 0:
            self.batch_is_full = True
            return []
        page = self.page_size
        ceil = lambda n: -(-n // page) * page  # noqa: E731
        ratio = self.new_token_ratio
        total_offset = sum(
            min(r.max_new - r.generated, self.clip) * (1.0 if r.ignore_eos else ratio) for r in self.running
        )
        current_offset = 0
        rem_input = self.max_prefill_tokens
        can_run: list[_Req] = []
        for req in self.waiting:
            if rem_input <= 0:  # budget_state: OTHER
                break
            if len(can_run) >= allocatable:
                self.batch_is_full = True
                break
            prefix_keys = self._match(req)
            prefix = len(prefix_keys) * self.cache_page_size
            extend = req.fill_len - prefix
            max_new = min(max(req.max_new - req.generated, 0), self.clip)
            total_tokens = extend + max_new + page
            self._pin(prefix_keys)  # add_one_req's _lock_node: the prefix is not evictable budget
            remaining_total = self.available_tokens + self.evictable_tokens - total_offset
            if not total_tokens < remaining_total:
                self._unpin(prefix_keys)
                self.batch_is_full = bool(can_run) or bool(self.running)  # NO_TOKEN
                break
            if can_run and ceil(extend) >= rem_input:  # no chunking: past the input cap, but not the first
                self._unpin(prefix_keys)
                break
            req.pages, req.prefix, req.extend = list(prefix_keys), prefix, extend
            can_run.append(req)
            total_offset += ceil(extend) + page + max_new  # PrefillBudget.reserve
            current_offset += ceil(extend) + page
            rem_input -= ceil(extend)
            free = self.available_tokens + self.evictable_tokens
            if free - total_offset <= 0 or free - current_offset <= 0:
                self.batch_is_full = True  # NO_TOKEN, with a request admitted
                break
        if not can_run:
            return []
        admitted = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        return can_run

    def _run_prefill(self, batch: list[_Req], info: StepInfo) -> list[RequestStats]:
        now = self.clock
        ran: list[_Req] = []
        for req in batch:
            req.kv_len = len(req.pages) * self.cache_page_size
            if not self._alloc(req, req.extend):  # the budget said it fits; stay safe if not
                self._unpin(req.pages)
                req.pages, req.kv_len = [], 0
                self.waiting.insert(len(ran), req)
                continue
            st = req.stats
            if st.forward_entry_time is None:
                st.forward_entry_time = now
            st.queue_time += now - req.wait_since
            ran.append(req)
        extend = sum(r.extend for r in ran)
        kv = sum(r.kv_len for r in ran)
        seconds = self.step_model.seconds(len(ran), kv, extend)
        self.clock += seconds
        info.kind, info.seconds, info.batch_size = "prefill", seconds, len(ran)
        info.extend_tokens, info.kv_tokens, info.admitted = extend, kv, [r.key for r in ran]
        # metrics: the batch's cache hit rate (metrics_reporter.log_prefill_stats), prefill busy time
        hit = sum(r.prefix for r in ran if not r.stained)
        inp = sum(r.extend for r in ran if not r.stained)
        self.cache_hit_rate = hit / (hit + inp) if hit + inp else 0.0
        self._hit_tokens += hit
        self._input_tokens += inp
        self.total_prefill_busy_us += int(seconds * 1e6)
        self.total_prefill_uncached_tokens += extend

        left: list[RequestStats] = []
        for req in ran:
            req.generated += 1
            st = req.stats
            if not req.stained:
                st.cached_tokens += req.prefix
            if st.prefill_finished_time is None:
                st.prefill_finished_time = self.clock
            if req.generated >= req.output_len:
                self._release(req, publish=True)
                del self._reqs[req.key]
                left.append(self._stats(req))
            else:
                self._publish(req)  # checkpoint_kv_cache: the prompt is cached once prefilled
                self.running.append(req)
        if left:
            self.batch_is_full = False
        return left

    def _decode_fits(self, reqs: Sequence[_Req]) -> bool:
        """`check_decode_mem` (page_size 1, no speculative decoding): one new slot per request."""
        need = len(reqs)
        self._evict_to(need)
        return self.available_tokens >= need

    def _run_decode(self, info: StepInfo) -> list[RequestStats]:
        left: list[RequestStats] = []
        initial = len(self.running)
        if not self._decode_fits(self.running):
            left += self._retract(info)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio)
        if len(self.running) < initial:
            self.batch_is_full = False
        if not self.running:
            return left
        for req in self.running:
            self._alloc(req, 1)
            req.generated += 1
        kv = sum(r.kv_len for r in self.running)
        n = len(self.running)
        seconds = self.step_model.seconds(n, kv, 0)
        self.clock += seconds
        info.kind, info.seconds, info.batch_size, info.kv_tokens = "decode", seconds, n, kv
        # metrics: decode cadence moments (scheduler._accumulate_decode_moment), gen_throughput
        step_us = int(seconds * 1e6)
        if self._last_kind == "decode" and 0 < step_us < STEP_MAX_US:
            m = self.decode_moments
            m[0] += 1.0
            m[1] += n
            m[2] += step_us
            m[3] += n * n
            m[4] += n * step_us
            m[5] += n
        self._decode_ct += 1
        self._decode_tokens += n
        if self._decode_ct % DECODE_LOG_INTERVAL == 0:
            gap = self.clock - self._decode_tic
            self.gen_throughput = self._decode_tokens / gap if gap > 0 else 0.0
            self._decode_tic = self.clock
            self._decode_tokens = 0

        keep: list[_Req] = []
        for req in self.running:
            if req.generated >= req.output_len:
                self._release(req, publish=True)
                del self._reqs[req.key]
                left.append(self._stats(req))
            else:
                keep.append(req)
        if len(keep) != len(self.running):
            self.running = keep
            self.batch_is_full = False
        return left

    def _retract(self, info: StepInfo) -> list[RequestStats]:
        """`retract_decode`: free KV from the least advanced requests until the decode step fits."""
        reqs = self.running
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].generated, -reqs[i].prompt_len), reverse=True)
        retracted: list[_Req] = []
        left: list[RequestStats] = []
        first = True
        while first or not self._decode_fits([reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            self._release(req, publish=False)  # no insert: the space is needed now
            self._evict_to(len(order) * RETRACT_DECODE_STEPS)
            req.stats.num_retractions += 1  # Req.reset_for_retract
            req.stained = True
            req.prefix = req.extend = 0
            req.wait_since = self.clock
            retracted.append(req)
        if len(order) <= 1 and not self._decode_fits([reqs[i] for i in order]):
            req = reqs[order.pop()]
            self._release(req, publish=False)
            del self._reqs[req.key]
            st = self._stats(req)
            st.error, st.status_code = OOM_MESSAGE, 500
            left.append(st)
        self.running = [reqs[i] for i in order]
        self.waiting.extend(retracted)  # _add_request_to_queue(is_retracted=True): to the back
        kept = self.running
        decoded = sum(r.generated for r in kept)
        budget = sum(r.max_new for r in kept)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (budget + 1))
        self.last_retracted = len(retracted)
        self.num_retractions_total += len(retracted)
        info.retracted = [r.key for r in retracted]
        return left

    # -- load
    def load(self, dp_rank: int = 0, *, timestamp: float | None = None) -> dict[str, Any]:
        """This rank's entry of 0.5.23's `/v1/loads` (`load_inquirer.get_loads`, `LoadSnapshot.to_dict`).

        Keys in `LoadSnapshot`'s field order; `memory`, `disaggregation` and `queues` as a server
        without speculative decoding or LoRA has them (sizes in GB are 0: nothing is loaded).
        `timestamp` defaults to the virtual clock.
        """
        used = self.used_tokens
        waiting_tokens = sum(r.fill_len for r in self.waiting)
        hit_total = self._hit_tokens + self._input_tokens
        miss_rate = 1.0 - (self._hit_tokens / hit_total if hit_total else 0.0)
        gen = self.gen_throughput if self.clock - self._decode_tic <= GEN_THROUGHPUT_STALENESS_S else 0.0
        return {
            "timestamp": self.clock if timestamp is None else timestamp,
            "dp_rank": dp_rank,
            "num_running_reqs": len(self.running),
            "num_waiting_reqs": len(self.waiting),
            "num_waiting_uncached_tokens": sum(int(r.fill_len * miss_rate) for r in self.waiting),
            "num_used_tokens": used,
            "num_total_tokens": used + waiting_tokens,
            "num_active_tokens": used + waiting_tokens,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": self.max_total_tokens,
            "max_running_requests": self.max_running_requests,
            "token_usage": round(used / self.max_total_tokens, 4),
            "gen_throughput": round(gen, 2),
            "cache_hit_rate": round(self.cache_hit_rate, 4),
            "utilization": 0.0,
            "total_prefill_uncached_tokens": self.total_prefill_uncached_tokens,
            "total_prefill_busy_us": self.total_prefill_busy_us,
            "decode_moments": list(self.decode_moments) if self.decode_moments[0] > 0 else None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": self.max_total_tokens},
            "disaggregation": dict(DISAGGREGATION_NULL),
            "queues": {
                "waiting": len(self.waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": self.last_retracted,
                "prealloc_ready": 0,
            },
        }


# load_snapshot.DisaggregationMetrics of a server without PD disaggregation.
DISAGGREGATION_NULL: dict[str, Any] = {
    "mode": "null",
    "prefill_bootstrap_queue_reqs": 0,
    "prefill_inflight_queue_reqs": 0,
    "decode_prealloc_queue_reqs": 0,
    "decode_transfer_queue_reqs": 0,
    "decode_retracted_queue_reqs": 0,
    "kv_transfer_speed_gb_s": 0.0,
    "kv_transfer_latency_ms": 0.0,
}
