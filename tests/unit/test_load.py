"""The server's load as the client reads it, the concurrency that follows it, and the client's slots."""

import asyncio
import collections
import math
import random

import pytest

from eagle3_datagen.engine.capacity import KVScheduler, StepModel
from eagle3_datagen.generation.load import Concurrency, Load, Timeline, parse_loads
from eagle3_datagen.generation.pacing import Slots


def test_v1_loads_and_get_load_read_as_one_load_over_ranks():
    v1 = {
        "timestamp": "2026-12-01T00:00:00+00:00",
        "version": "0.5.23",
        "loads": [
            {"dp_rank": 0, "num_running_reqs": 30, "num_waiting_reqs": 2, "num_used_tokens": 900,
             "max_total_num_tokens": 1000, "max_running_requests": 64},
            {"dp_rank": 1, "num_running_reqs": 10, "num_waiting_reqs": 0, "num_used_tokens": 100,
             "max_total_num_tokens": 1000, "max_running_requests": 64},
        ],
    }  # fmt: skip
    load = parse_loads(v1)
    assert (load.running, load.waiting, load.ranks, load.used_tokens) == (40, 2, 2, 1000)
    # 0.5.8's /get_load: num_reqs counts the running and the waiting requests together.
    old = [{"dp_rank": 0, "num_reqs": 12, "num_waiting_reqs": 3, "num_tokens": 500, "ts_tic": 1.0}]
    assert parse_loads(old) == Load(running=9, waiting=3, used_tokens=500, ranks=1)
    for bad in ({"loads": []}, {"detail": "Not Found"}, [{"num_reqs": "x"}], "text", {"loads": [{"dp_rank": 0}]}):
        with pytest.raises(ValueError):
            parse_loads(bad)


def test_the_load_the_engine_serves_reads_as_the_scheduler_holds_it():
    """The local engine's /v1/loads entry, made from its capacity model, as the client reads it."""
    scheduler = KVScheduler(8, 10_000, step_model=StepModel())
    for key in range(12):
        scheduler.add(key, 100, 50, 64)
    scheduler.step()
    entry = scheduler.load()
    load = parse_loads({"loads": [entry]})
    assert (load.running, load.waiting, load.ranks, load.used_tokens) == (8, 4, 1, 8 * 101)
    assert (entry["max_running_requests"], entry["max_total_num_tokens"]) == (8, 10_000)


def test_a_fixed_concurrency_never_moves():
    control = Concurrency(16)
    control.retracted(5)
    assert control.observe(Load(running=16, waiting=40), in_flight=16) == 16
    assert control.observe(Load(running=2, waiting=0), in_flight=16) == 16


def test_auto_doubles_while_the_server_has_room_then_follows_what_it_runs():
    control = Concurrency(1000, auto=True, queue_target=2, start=8)
    limits = []
    for _ in range(4):  # the server runs all it is sent, nothing waits
        limits.append(control.observe(Load(running=control.limit, waiting=0), in_flight=control.limit))
    assert limits == [16, 32, 64, 128]
    # The server runs at most 100: the rest wait. One such reading may be requests not yet admitted;
    # the second, a poll later, ends slow start: 100 running + 20 waiting (a fifth of what runs).
    assert control.observe(Load(running=90, waiting=38), in_flight=128) == 128 and control.slow_start
    assert control.observe(Load(running=100, waiting=28), in_flight=128) == 120
    assert not control.slow_start
    assert control.target(Load(running=100, waiting=0)) == 20 and control.target(Load(running=3, waiting=0)) == 2
    # From then on it follows what runs, plus a fifth; nothing waiting with every slot in use: at
    # least a step more.
    assert control.observe(Load(running=110, waiting=10), in_flight=120) == 110 + 22
    assert control.observe(Load(running=132, waiting=0), in_flight=132) == 132 + 27
    control.queue_target = 100
    assert control.observe(Load(running=159, waiting=0), in_flight=159) == 159 + 100
    control.queue_target = 2
    control.QUEUE_SHARE = 0.0
    assert control.observe(Load(running=259, waiting=0), in_flight=259) == 259 + 12
    assert control.observe(Load(running=60, waiting=0), in_flight=60) == 60 + 2  # fewer run: fewer sent
    # A reading behind what was sent (60 seen of 70, nothing waiting) leaves the limit as it is.
    assert control.observe(Load(running=55, waiting=0), in_flight=70) == 62


def test_auto_grows_only_on_readings_that_have_caught_up_with_what_was_sent():
    control = Concurrency(1000, auto=True, queue_target=2, start=64)
    # 64 sent, the server has seen 20 of them so far: it looks idle, but that says nothing yet.
    assert control.observe(Load(running=20, waiting=0), in_flight=64) == 64
    assert control.slow_start
    assert control.observe(Load(running=63, waiting=0), in_flight=64) == 128  # caught up: room indeed
    control.slow_start = False
    assert control.observe(Load(running=100, waiting=0), in_flight=128) == 128  # 100 + 20 < 128 - 2: wait
    assert control.observe(Load(running=127, waiting=0), in_flight=128) == 127 + 26


def test_auto_backs_off_on_retractions_to_what_the_server_runs():
    control = Concurrency(1000, auto=True, queue_target=2, start=200)
    control.retracted(3)
    assert control.observe(Load(running=150, waiting=5), in_flight=200) == 150 + 30
    assert control.retractions == 3 and control.cuts == 1 and not control.slow_start
    # Retractions are counted once: the next reading follows what runs again.
    assert control.observe(Load(running=180, waiting=0), in_flight=180) == 180 + 36
    # A retraction never raises the limit, however many run.
    control.retracted(1)
    assert control.observe(Load(running=400, waiting=0), in_flight=216) == 216
    assert Concurrency(1000, auto=True, start=4).observe(Load(running=4, waiting=0), in_flight=4) == 8
    assert Concurrency(10, auto=True, start=8).observe(Load(running=8, waiting=0), in_flight=8) == 10  # the cap


def test_the_queue_target_is_per_data_parallel_rank():
    control = Concurrency(1000, auto=True, queue_target=2, start=64)
    control.slow_start = False
    # Four ranks: 8 waiting is on target (2 per rank, more than a fifth of 24 running).
    assert control.target(Load(running=24, waiting=8, ranks=4)) == 8
    assert control.observe(Load(running=24, waiting=8, ranks=4), in_flight=32) == 32


def test_the_timeline_thins_itself_and_keeps_its_columns():
    timeline = Timeline(max_points=8)
    for i in range(100):
        timeline.add(i * 0.5, i % 7, 16, Load(running=i % 5, waiting=1) if i % 2 else None)
    cols = timeline.as_columns()
    assert 4 <= len(cols["t"]) < 8 and cols["t"] == sorted(cols["t"])
    assert set(cols) == {"t", "in_flight", "limit", "running", "waiting"}
    assert all(v == 16 for v in cols["limit"])


def test_slots_follow_a_changing_limit_without_cutting_a_holder_short():
    async def main():
        slots = Slots(2)
        await slots.acquire()
        await slots.acquire()
        waiter = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()
        slots.set_limit(3)  # a higher limit wakes a waiter at once
        await asyncio.sleep(0)
        assert waiter.done() and slots.held == 3
        slots.set_limit(1)  # a lower one: the three holders keep their slots
        slots.release()
        slots.release()
        late = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0)
        assert not late.done() and slots.held == 1
        slots.release()
        await asyncio.sleep(0)
        assert late.done() and slots.held == 1
        # A waiter cancelled after being handed a slot gives it back.
        cancelled = asyncio.ensure_future(slots.acquire())
        await asyncio.sleep(0)
        slots.release()  # hands the slot to `cancelled`
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        assert slots.held == 0

    asyncio.run(main())


# -- the control loop against the local engine's capacity model (SGLang 0.5.23's scheduler), in its
# virtual time: the client sends the moment a slot is free and reads /v1/loads every POLL_S.
POLL_S = 0.1


def workload(n: int, seed: int = 7) -> list[tuple[int, int, int]]:
    """(prompt tokens, answer tokens, max_new_tokens): long-tailed answers, 15 % running to the budget."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        answer = 1024 if rng.random() < 0.15 else max(16, min(1000, round(rng.lognormvariate(math.log(120), 1.0))))
        out.append((rng.randint(100, 400), answer, 1024))
    return out


def simulate(max_running: int, kv_tokens: int, control: Concurrency, requests) -> dict:
    sched = KVScheduler(
        max_running, kv_tokens, step_model=StepModel(base_ms=1.0, per_request_ms=0.01), clip_max_new_tokens=128
    )
    pending = collections.deque(enumerate(requests))
    in_flight = tokens = retractions = polls = waiting = 0
    next_poll = 0.0
    while pending or in_flight:
        while pending and in_flight < control.limit:
            key, (prompt, answer, budget) = pending.popleft()
            sched.add(key, prompt, answer, budget)
            in_flight += 1
        finished, _ = sched.step()
        for stats in finished:
            in_flight -= 1
            tokens += stats.output_len
            retractions += stats.num_retractions
            control.retracted(stats.num_retractions)
        if sched.clock >= next_poll:
            load = parse_loads({"loads": [sched.load()]})  # the /v1/loads answer the engine serves
            control.observe(load, in_flight)
            polls, waiting, next_poll = polls + 1, waiting + load.waiting, sched.clock + POLL_S
    return {"tok_s": tokens / sched.clock, "retractions": retractions, "waiting": waiting / polls}


@pytest.mark.parametrize(
    "max_running, kv_tokens",
    [(48, 10**6), (512, 6_000)],
    ids=["bound by max_running_requests", "bound by the KV cache"],
)
def test_auto_is_near_the_best_fixed_concurrency_on_either_server(max_running, kv_tokens):
    requests = workload(300)
    sweep = {c: simulate(max_running, kv_tokens, Concurrency(c), requests) for c in (4, 8, 16, 32, 48, 64, 128, 256)}
    best = max(sweep.values(), key=lambda r: r["tok_s"])
    auto = simulate(max_running, kv_tokens, Concurrency(1024, auto=True), requests)
    assert auto["tok_s"] >= 0.95 * best["tok_s"], (auto, best)
    # It gets there without the deep queue a large fixed value keeps, and without more retractions.
    deep = sweep[256]
    assert auto["waiting"] < deep["waiting"] / 4 and auto["retractions"] <= deep["retractions"]


def test_a_fixed_value_right_for_one_server_is_wrong_for_the_other():
    requests = workload(300)
    small = {c: simulate(512, 6_000, Concurrency(c), requests)["tok_s"] for c in (4, 8, 16, 24, 32, 48, 64)}
    # The value a user would tune for the small (KV-bound) server: the least within 2 % of its best.
    tuned = min(c for c, v in small.items() if v >= 0.98 * max(small.values()))
    big_tuned = simulate(48, 10**6, Concurrency(tuned), requests)["tok_s"]
    big_auto = simulate(48, 10**6, Concurrency(1024, auto=True), requests)["tok_s"]
    assert big_tuned < 0.8 * big_auto, (tuned, big_tuned, big_auto)
    # And the other way round: the big server's value on the small one queues deep for nothing.
    big = {c: simulate(48, 10**6, Concurrency(c), requests)["tok_s"] for c in (16, 32, 48, 64)}
    big_value = min(c for c, v in big.items() if v >= 0.98 * max(big.values()))
    assert big_value >= 2 * tuned
