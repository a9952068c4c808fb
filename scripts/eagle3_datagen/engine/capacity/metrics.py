"""The numbers a simulated rank reports in its `/v1/loads` entry (`LoadMetrics`), as SGLang 0.5.23
keeps them: the last prefill batch's cache hit rate (`metrics_reporter.log_prefill_stats`), prefill
busy time and uncached tokens, decode cadence moments (`scheduler._accumulate_decode_moment`),
`gen_throughput` over the last `--decode-log-interval` decode steps, retractions; and the entry
itself (`load_inquirer.get_loads`, `LoadSnapshot.to_dict`).

Imports nothing of the engine.
"""

from collections.abc import Sequence
from typing import Any

DECODE_LOG_INTERVAL = 40  # --decode-log-interval: the window of gen_throughput
GEN_THROUGHPUT_STALENESS_S = 30.0  # metrics_reporter.GEN_THROUGHPUT_STALENESS_SECONDS
STEP_MAX_US = 2_000_000  # scheduler.STEP_MAX_US: longer decode gaps are not decode cadence

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


class LoadMetrics:
    """Counters the scheduler updates after each step; `snapshot` turns them into a load entry."""

    def __init__(self) -> None:
        self.cache_hit_rate = 0.0
        self._hit_tokens = 0
        self._input_tokens = 0
        self.total_prefill_uncached_tokens = 0
        self.total_prefill_busy_us = 0
        self.decode_moments = [0.0] * 6
        self.last_kind = "idle"  # the kind of the previous step
        self.gen_throughput = 0.0
        self._decode_ct = 0
        self._decode_tokens = 0
        self._decode_tic = 0.0
        self.last_retracted = 0
        self.num_retractions_total = 0

    def on_prefill(self, ran: Sequence[Any], extend: int, seconds: float) -> None:
        """A prefill batch of `ran` (requests with `prefix`, `extend`, `stained`) took `seconds`."""
        hit = sum(r.prefix for r in ran if not r.stained)
        inp = sum(r.extend for r in ran if not r.stained)
        self.cache_hit_rate = hit / (hit + inp) if hit + inp else 0.0
        self._hit_tokens += hit
        self._input_tokens += inp
        self.total_prefill_busy_us += int(seconds * 1e6)
        self.total_prefill_uncached_tokens += extend

    def on_decode(self, n: int, seconds: float, clock: float) -> None:
        """A decode step of `n` requests took `seconds`, ending at virtual time `clock`."""
        step_us = int(seconds * 1e6)
        if self.last_kind == "decode" and 0 < step_us < STEP_MAX_US:
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
            gap = clock - self._decode_tic
            self.gen_throughput = self._decode_tokens / gap if gap > 0 else 0.0
            self._decode_tic = clock
            self._decode_tokens = 0

    def on_retract(self, n: int) -> None:
        self.last_retracted = n
        self.num_retractions_total += n

    def snapshot(self, sched: Any, dp_rank: int, timestamp: float) -> dict[str, Any]:
        """The load entry of `sched` (a `scheduler.KVScheduler`), keys in `LoadSnapshot`'s field order;
        `memory`, `disaggregation` and `queues` as a server without speculative decoding or LoRA has
        them (sizes in GB are 0: nothing is loaded)."""
        used = sched.used_tokens
        waiting_tokens = sum(r.fill_len for r in sched.waiting)
        hit_total = self._hit_tokens + self._input_tokens
        miss_rate = 1.0 - (self._hit_tokens / hit_total if hit_total else 0.0)
        gen = self.gen_throughput if sched.clock - self._decode_tic <= GEN_THROUGHPUT_STALENESS_S else 0.0
        return {
            "timestamp": timestamp,
            "dp_rank": dp_rank,
            "num_running_reqs": len(sched.running),
            "num_waiting_reqs": len(sched.waiting),
            "num_waiting_uncached_tokens": sum(int(r.fill_len * miss_rate) for r in sched.waiting),
            "num_used_tokens": used,
            "num_total_tokens": used + waiting_tokens,
            "num_active_tokens": used + waiting_tokens,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": sched.max_total_tokens,
            "max_running_requests": sched.max_running_requests,
            "token_usage": round(used / sched.max_total_tokens, 4),
            "gen_throughput": round(gen, 2),
            "cache_hit_rate": round(self.cache_hit_rate, 4),
            "utilization": 0.0,
            "total_prefill_uncached_tokens": self.total_prefill_uncached_tokens,
            "total_prefill_busy_us": self.total_prefill_busy_us,
            "decode_moments": list(self.decode_moments) if self.decode_moments[0] > 0 else None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": sched.max_total_tokens},
            "disaggregation": dict(DISAGGREGATION_NULL),
            "queues": {
                "waiting": len(sched.waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": self.last_retracted,
                "prealloc_ready": 0,
            },
        }
