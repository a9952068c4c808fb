"""SGLang 0.5.23's scheduling of one DP rank in virtual time (`KVScheduler`): admission, prefill,
decode and retraction, over a `kv_pool.KVPool`, timed by a `step_model.StepModel`.

The rules follow these places in SGLang 0.5.23 (`python/sglang/srt/`):

- `managers/scheduler.py` `get_next_batch_to_run`: a step is a prefill batch when one can be
  formed, else a decode step of every running request (mixed chunked prefill off, its default).
  A prefill gives each admitted request its first token; a decode step one token per request.
- Admission (`PrefillAdder`): see `admission`.
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
- Prefix cache: see `kv_pool`. A prompt's `cached_tokens` is its longest cached page-aligned
  prefix, counted once: a retracted request's second prefill does not add to it (`retracted_stain`).
- Queue time (`observability/req_time_stats.py` `set_wait_queue_entry_time`,
  `set_forward_entry_time`): the time from entering the waiting queue to the start of the prefill
  that admits it, summed over every stay (after each retraction too).
- Limits (`managers/scheduler.py` `init_req_max_new_tokens`, `tp_worker.get_worker_info`,
  `managers/utils.py` `validate_input_length`): `max_req_len = min(context - 1, max_total_tokens -
  1)`, `max_new_tokens` is clipped to `max_req_len - input - 1` and to the empty pool,
  `max_total_tokens - ceil_page(input) - page_size - 1`; a prompt of `max_req_len - 5` tokens or more
  is refused.

Imports `capacity.step_model`, `.request_state`, `.kv_pool`, `.metrics` and `.admission`.
"""

from collections.abc import Hashable, Sequence
from typing import Any

from eagle3_datagen.engine.capacity.admission import select_prefill_batch
from eagle3_datagen.engine.capacity.kv_pool import KVPool
from eagle3_datagen.engine.capacity.metrics import LoadMetrics
from eagle3_datagen.engine.capacity.request_state import RequestStats, SchedReq, StepInfo
from eagle3_datagen.engine.capacity.step_model import StepModel

# SGLang 0.5.23's defaults: srt/environ.py (envs) and srt/arg_groups/fields/schedule.py (flags).
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, schedule_policy.CLIP_MAX_NEW_TOKENS
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens

OOM_MESSAGE = "Out of memory even after retracting all other requests in the decode batch. Aborting the last request."


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
        self.waiting: list[SchedReq] = []
        self.running: list[SchedReq] = []
        self._reqs: dict[Hashable, SchedReq] = {}
        self._refused: list[RequestStats] = []
        self.batch_is_full = False
        self.last_step = StepInfo()
        self.pool = KVPool(max_total_tokens, page_size=cache_page_size, prefix_cache=prefix_cache)
        self.metrics = LoadMetrics()

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
        return self.pool.cached_tokens

    @property
    def evictable_tokens(self) -> int:
        return self.pool.evictable_tokens

    @property
    def available_tokens(self) -> int:
        return self.pool.available_tokens

    @property
    def used_tokens(self) -> int:
        """`pool_stats_observer._get_token_info`: the pool less what is free or evictable."""
        return self.pool.used_tokens

    @property
    def cache_hit_rate(self) -> float:
        """The last prefill batch's share of prompt tokens found in the cache."""
        return self.metrics.cache_hit_rate

    @property
    def num_retractions_total(self) -> int:
        return self.metrics.num_retractions_total

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
        req = SchedReq(key, prompt_ids, prompt_len, output_ids, output_len, max_new, ignore_eos, self.clock)
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
            self.pool.release(req, publish=True)
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
        self.pool.clear()
        return True

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting or self._refused)

    def _stats(self, req: SchedReq) -> RequestStats:
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
        batch = select_prefill_batch(self)
        if batch:
            left += self._run_prefill(batch, info)
        elif self.running:
            left += self._run_decode(info)
        elif not self.waiting:
            self.new_token_ratio = self.init_new_token_ratio  # on_idle: fully idle
        info.finished = [st.key for st in left]
        self.last_step = info
        self.metrics.last_kind = info.kind
        return left, info.seconds

    def _run_prefill(self, batch: list[SchedReq], info: StepInfo) -> list[RequestStats]:
        now = self.clock
        ran: list[SchedReq] = []
        for req in batch:
            req.kv_len = len(req.pages) * self.cache_page_size
            if not self.pool.alloc(req, req.extend):  # the budget said it fits; stay safe if not
                self.pool.unpin(req.pages)
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
        self.metrics.on_prefill(ran, extend, seconds)

        left: list[RequestStats] = []
        for req in ran:
            req.generated += 1
            st = req.stats
            if not req.stained:
                st.cached_tokens += req.prefix
            if st.prefill_finished_time is None:
                st.prefill_finished_time = self.clock
            if req.generated >= req.output_len:
                self.pool.release(req, publish=True)
                del self._reqs[req.key]
                left.append(self._stats(req))
            else:
                self.pool.publish(req)  # checkpoint_kv_cache: the prompt is cached once prefilled
                self.running.append(req)
        if left:
            self.batch_is_full = False
        return left

    def _decode_fits(self, reqs: Sequence[SchedReq]) -> bool:
        """`check_decode_mem` (page_size 1, no speculative decoding): one new slot per request."""
        need = len(reqs)
        self.pool.evict_to(need)
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
            self.pool.alloc(req, 1)
            req.generated += 1
        kv = sum(r.kv_len for r in self.running)
        n = len(self.running)
        seconds = self.step_model.seconds(n, kv, 0)
        self.clock += seconds
        info.kind, info.seconds, info.batch_size, info.kv_tokens = "decode", seconds, n, kv
        self.metrics.on_decode(n, seconds, self.clock)

        keep: list[SchedReq] = []
        for req in self.running:
            if req.generated >= req.output_len:
                self.pool.release(req, publish=True)
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
        retracted: list[SchedReq] = []
        left: list[RequestStats] = []
        first = True
        while first or not self._decode_fits([reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            self.pool.release(req, publish=False)  # no insert: the space is needed now
            self.pool.evict_to(len(order) * RETRACT_DECODE_STEPS)
            req.stats.num_retractions += 1  # Req.reset_for_retract
            req.stained = True
            req.prefix = req.extend = 0
            req.wait_since = self.clock
            retracted.append(req)
        if len(order) <= 1 and not self._decode_fits([reqs[i] for i in order]):
            req = reqs[order.pop()]
            self.pool.release(req, publish=False)
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
        self.metrics.on_retract(len(retracted))
        info.retracted = [r.key for r in retracted]
        return left

    # -- load
    def load(self, dp_rank: int = 0, *, timestamp: float | None = None) -> dict[str, Any]:
        """This rank's entry of 0.5.23's `/v1/loads` (see `metrics`); `timestamp` defaults to the virtual clock."""
        return self.metrics.snapshot(self, dp_rank, self.clock if timestamp is None else timestamp)
