"""Which waiting requests the simulated scheduler prefills next: SGLang 0.5.23's admission, chunked
prefill off (`select_prefill_batch`).

`managers/scheduler.py` `_get_new_batch_prefill_raw` and `managers/schedule_policy.py`
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

Imports `capacity.request_state` only (the scheduler is passed in).
"""

from typing import Any

from eagle3_datagen.engine.capacity.request_state import SchedReq


def select_prefill_batch(sched: Any) -> list[SchedReq]:
    """`_get_new_batch_prefill_raw` with a `PrefillAdder`, chunked prefill off: the waiting requests
    `sched` (a `scheduler.KVScheduler`) prefills next, taken out of its queue, their cache prefix pinned."""
    if not sched.running:
        sched.batch_is_full = False
    if sched.batch_is_full or not sched.waiting:
        return []
    running_bs = len(sched.running)
    allocatable = sched.max_running_requests - running_bs
    if allocatable <= 0:
        sched.batch_is_full = True
        return []
    page = sched.page_size
    ceil = lambda n: -(-n // page) * page  # noqa: E731
    ratio = sched.new_token_ratio
    total_offset = sum(
        min(r.max_new - r.generated, sched.clip) * (1.0 if r.ignore_eos else ratio) for r in sched.running
    )
    current_offset = 0
    rem_input = sched.max_prefill_tokens
    can_run: list[SchedReq] = []
    for req in sched.waiting:
        if rem_input <= 0:  # budget_state: OTHER
            break
        if len(can_run) >= allocatable:
            sched.batch_is_full = True
            break
        prefix_keys = sched.pool.match(req)
        prefix = len(prefix_keys) * sched.cache_page_size
        extend = req.fill_len - prefix
        max_new = min(max(req.max_new - req.generated, 0), sched.clip)
        total_tokens = extend + max_new + page
        sched.pool.pin(prefix_keys)  # add_one_req's _lock_node: the prefix is not evictable budget
        remaining_total = sched.available_tokens + sched.evictable_tokens - total_offset
        if not total_tokens < remaining_total:
            sched.pool.unpin(prefix_keys)
            sched.batch_is_full = bool(can_run) or bool(sched.running)  # NO_TOKEN
            break
        if can_run and ceil(extend) >= rem_input:  # no chunking: past the input cap, but not the first
            sched.pool.unpin(prefix_keys)
            break
        req.pages, req.prefix, req.extend = list(prefix_keys), prefix, extend
        can_run.append(req)
        total_offset += ceil(extend) + page + max_new  # PrefillBudget.reserve
        current_offset += ceil(extend) + page
        rem_input -= ceil(extend)
        free = sched.available_tokens + sched.evictable_tokens
        if free - total_offset <= 0 or free - current_offset <= 0:
            sched.batch_is_full = True  # NO_TOKEN, with a request admitted
            break
    if not can_run:
        return []
    admitted = set(map(id, can_run))
    sched.waiting = [r for r in sched.waiting if id(r) not in admitted]
    return can_run
