"""The load endpoints' answers, as pure functions of per-rank load snapshots.

A snapshot is a dict with `LoadSnapshot`'s fields (0.5.23's `srt/managers/load_snapshot.py`), as
`capacity.scheduler.KVScheduler.load` or `inflight_snapshot` make it. From it:

- 0.5.23 `GET /v1/loads` (`srt/entrypoints/v1_loads.py` `get_loads`, `LoadSnapshot.to_dict`):
  `{"timestamp": ISO-8601 UTC, "version", "accelerator", "num_accelerators", "loads": [...]}`, one
  entry per DP rank (`dp_rank` filters; out of range gives `[]`), `include` a comma-separated
  list of sections (`core` alone: the flat fields only). A section name outside
  `LoadSnapshot.VALID_SECTIONS` makes `to_dict` raise ValueError *after* the handler's
  `try`/`except` (only `tokenizer_manager.get_loads` is guarded, and it does not look at
  `include`), so 0.5.23 answers such a request with FastAPI's bare HTTP 500 — when there is a
  load to format; `all` anywhere in the list turns the check off. `format=prometheus`:
  `_format_loads_prometheus`.
- 0.5.8 `GET /v1/loads` (0.5.8's `srt/entrypoints/v1_loads.py`, `io_struct.GetLoadsReqOutput`,
  `scheduler_metrics_mixin.get_loads`): `{"timestamp", "version", "dp_rank_count", "loads",
  "aggregate"}`; each load is `dataclasses.asdict` without None values and without its
  `timestamp`, plus `num_total_reqs`. A bad `include` is a ValueError in `GetLoadsReqInput`, caught:
  HTTP 400. With one DP rank 0.5.8's scheduler has `dp_rank` None, so the key is left out and a
  `dp_rank` filter matches nothing.
- 0.5.8 `GET /get_load` (`http_server.get_load`, `io_struct.GetLoadReqOutput`): a list of
  `dataclasses.asdict` dicts as FastAPI's `jsonable_encoder` makes them, `BaseReq`'s `rid` and
  `http_worker_ipc` (None) first; `num_tokens` is the pool's used tokens plus the waiting
  requests' lengths, `ts_tic` a `time.perf_counter()` reading. 0.5.23 has no such route.

Imports `capacity.metrics` only.
"""

import datetime
import time
from collections.abc import Iterable
from typing import Any

from eagle3_datagen.engine.capacity.metrics import DISAGGREGATION_NULL

VALID_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
# LoadSnapshot's optional sections: (field, name in `include`).
_SECTIONS = (
    ("memory", "memory"),
    ("speculative", "spec"),
    ("lora", "lora"),
    ("disaggregation", "disagg"),
    ("queues", "queues"),
)
_SECTION_FIELDS = frozenset(f for f, _ in _SECTIONS)


def parse_include(include: str | None) -> list[str] | None:
    """`include.split(",")`, stripped; None for a missing or empty parameter."""
    return [s.strip() for s in include.split(",")] if include else None


def snapshot_to_dict(snapshot: dict[str, Any], include: set[str] | None) -> dict[str, Any]:
    """`LoadSnapshot.to_dict`: the flat fields, then the sections asked for that are present."""
    load = {k: v for k, v in snapshot.items() if k not in _SECTION_FIELDS}
    if include is None or "all" in include:
        include_all = True
    else:
        if not include <= VALID_SECTIONS:
            raise ValueError(
                f"Invalid include sections: {include - VALID_SECTIONS}. Valid options: {sorted(VALID_SECTIONS)}"
            )
        if include == {"core"}:
            return load
        include_all = False
    for field, name in _SECTIONS:
        section = snapshot.get(field)
        if section is None or (not include_all and name not in include):
            continue
        load[field] = dict(section)
    return load


def select_rank(snapshots: list[dict[str, Any]], dp_rank: int | None) -> list[dict[str, Any]]:
    """0.5.23's `tokenizer_control_mixin.get_loads`: every rank, or the one asked for (none if out of range)."""
    if dp_rank is None:
        return list(snapshots)
    if dp_rank < 0 or dp_rank >= len(snapshots):
        return []
    return [snapshots[dp_rank]]


def v1_loads(
    snapshots: list[dict[str, Any]], *, include: str | None, version: str, accelerator: str | None = None
) -> dict[str, Any]:
    """0.5.23's `/v1/loads` JSON body (raises ValueError for a bad `include`, see the module docstring)."""
    include_list = parse_include(include)
    include_set = set(include_list) if include_list else None
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": version,
        "accelerator": accelerator,
        "num_accelerators": 1,
        "loads": [snapshot_to_dict(s, include_set) for s in snapshots],
    }


def v1_loads_prometheus(snapshots: list[dict[str, Any]], *, include: str | None) -> str:
    """0.5.23's `_format_loads_prometheus`: one gauge per numeric field, sections prefixed."""
    include_list = parse_include(include)
    include_set = set(include_list) if include_list else None
    prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    samples: dict[str, list] = {}
    for snapshot in snapshots:
        load = snapshot_to_dict(snapshot, include_set)
        dp_rank = load.pop("dp_rank")
        for key, value in load.items():
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub_key, sub_value in value.items():
                    if isinstance(sub_value, (int, float)):
                        samples.setdefault(f"sglang_{prefix}_{sub_key}", []).append((dp_rank, sub_value))
            elif isinstance(value, (int, float)):
                samples.setdefault(f"sglang_{key}", []).append((dp_rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        for dp_rank, value in values:
            lines.append(f'{name}{{dp_rank="{dp_rank}"}} {value}')
    return "\n".join(lines) + "\n"


# -- 0.5.8


def _legacy_entry(snapshot: dict[str, Any], include: set[str]) -> dict[str, Any]:
    """One 0.5.8 `GetLoadsReqOutput`, as `dataclasses.asdict` with `_loads_dict_factory` gives it."""
    include_all = "all" in include
    d: dict[str, Any] = {
        # rid, http_worker_ipc, dp_rank (None with one rank) and timestamp are dropped
        "num_running_reqs": snapshot["num_running_reqs"],
        "num_waiting_reqs": snapshot["num_waiting_reqs"],
        "num_used_tokens": snapshot["num_used_tokens"],
        "max_total_num_tokens": snapshot["max_total_num_tokens"],
        "token_usage": snapshot["token_usage"],
        "gen_throughput": snapshot["gen_throughput"],
        "cache_hit_rate": snapshot["cache_hit_rate"],
        "utilization": snapshot["utilization"],
        "max_running_requests": snapshot["max_running_requests"],
    }
    if (include_all or "memory" in include) and snapshot.get("memory") is not None:
        d["memory"] = dict(snapshot["memory"])
    if include_all or "disagg" in include:
        dis = snapshot.get("disaggregation") or DISAGGREGATION_NULL
        d["disaggregation"] = {
            "mode": dis["mode"],
            "prefill_prealloc_queue_reqs": dis["prefill_bootstrap_queue_reqs"],
            "prefill_inflight_queue_reqs": dis["prefill_inflight_queue_reqs"],
            "decode_prealloc_queue_reqs": dis["decode_prealloc_queue_reqs"],
            "decode_transfer_queue_reqs": dis["decode_transfer_queue_reqs"],
            "decode_retracted_queue_reqs": dis["decode_retracted_queue_reqs"],
            "kv_transfer_speed_gb_s": dis["kv_transfer_speed_gb_s"],
            "kv_transfer_latency_ms": dis["kv_transfer_latency_ms"],
        }
    if include_all or "queues" in include:
        q = snapshot.get("queues") or {}
        d["queues"] = {
            "waiting": q.get("waiting", snapshot["num_waiting_reqs"]),
            "grammar": q.get("grammar", 0),
            "paused": q.get("paused", 0),
            "retracted": q.get("retracted", 0),
        }
    d["num_total_reqs"] = d["num_running_reqs"] + d["num_waiting_reqs"]
    return d


def legacy_v1_loads(
    snapshots: list[dict[str, Any]], *, include: str | None, dp_rank: int | None, version: str
) -> dict[str, Any]:
    """0.5.8's `/v1/loads` JSON body; raises ValueError (HTTP 400 there) for a bad `include`."""
    include_list = parse_include(include) or ["all"]  # tokenizer_communicator_mixin.get_loads
    invalid = set(include_list) - VALID_SECTIONS  # GetLoadsReqInput.__post_init__
    if invalid:
        raise ValueError(f"Invalid include sections: {invalid}. Valid options: {sorted(VALID_SECTIONS)}")
    # `r.dp_rank == dp_rank` with 0.5.8's dp_rank None: a filter keeps nothing.
    loads = [] if dp_rank is not None else [_legacy_entry(s, set(include_list)) for s in snapshots]
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": version,
        "dp_rank_count": len(loads),
        "loads": loads,
        "aggregate": _aggregate(loads),
    }


def _aggregate(loads: list[dict[str, Any]]) -> dict[str, Any]:
    """0.5.8's `_compute_aggregate`."""
    if not loads:
        return {
            "total_running_reqs": 0,
            "total_waiting_reqs": 0,
            "total_reqs": 0,
            "avg_token_usage": 0.0,
            "avg_throughput": 0.0,
            "avg_utilization": 0.0,
        }
    n = len(loads)
    return {
        "total_running_reqs": sum(d["num_running_reqs"] for d in loads),
        "total_waiting_reqs": sum(d["num_waiting_reqs"] for d in loads),
        "total_reqs": sum(d["num_running_reqs"] + d["num_waiting_reqs"] for d in loads),
        "avg_token_usage": round(sum(d["token_usage"] for d in loads) / n, 4),
        "avg_throughput": round(sum(d["gen_throughput"] for d in loads) / n, 2),
        "avg_utilization": round(sum(d["utilization"] for d in loads) / n, 4),
    }


def get_load(snapshots: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """0.5.8's `/get_load` body: one `GetLoadReqOutput` per rank (`scheduler_metrics_mixin.get_load`)."""
    return [
        {
            "rid": None,
            "http_worker_ipc": None,
            "dp_rank": None,
            "num_reqs": s["num_running_reqs"] + s["num_waiting_reqs"],
            "num_waiting_reqs": s["num_waiting_reqs"],
            "num_tokens": s["num_total_tokens"],
            "ts_tic": time.perf_counter(),
        }
        for s in snapshots
    ]


def inflight_snapshot(
    *,
    running: list[tuple[int, int]],
    waiting_tokens: list[int],
    max_running_requests: int,
    max_total_tokens: int,
    timestamp: float,
) -> dict[str, Any]:
    """A load snapshot of an engine without the capacity model: `running` holds (prompt, output) lengths
    of the requests being generated, `waiting_tokens` the prompt lengths of those queued. There is no
    cache and no throughput window: those fields are 0."""
    used = sum(p + o for p, o in running)
    total = used + sum(waiting_tokens)
    return {
        "timestamp": timestamp,
        "dp_rank": 0,
        "num_running_reqs": len(running),
        "num_waiting_reqs": len(waiting_tokens),
        "num_waiting_uncached_tokens": sum(waiting_tokens),
        "num_used_tokens": used,
        "num_total_tokens": total,
        "num_active_tokens": total,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": max_total_tokens,
        "max_running_requests": max_running_requests,
        "token_usage": round(used / max_total_tokens, 4) if max_total_tokens else 0.0,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": 0.0,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
        "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": max_total_tokens},
        "disaggregation": dict(DISAGGREGATION_NULL),
        "queues": {"waiting": len(waiting_tokens), "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }
