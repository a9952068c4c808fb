"""The server's load as the client reads it, the concurrency that follows it, and the client's slots."""

import asyncio

import pytest

from eagle3_datagen.client import Slots
from eagle3_datagen.load import Concurrency, Load, Timeline, parse_loads


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
    assert (load.running, load.waiting, load.ranks, load.max_running) == (40, 2, 2, 128)
    assert load.token_usage == 0.5
    # 0.5.8's /get_load: num_reqs counts the running and the waiting requests together.
    old = [{"dp_rank": 0, "num_reqs": 12, "num_waiting_reqs": 3, "num_tokens": 500, "ts_tic": 1.0}]
    assert parse_loads(old) == Load(running=9, waiting=3, used_tokens=500, ranks=1)
    for bad in ({"loads": []}, {"detail": "Not Found"}, [{"num_reqs": "x"}], "text", {"loads": [{"dp_rank": 0}]}):
        with pytest.raises(ValueError):
            parse_loads(bad)


def test_a_fixed_concurrency_never_moves():
    control = Concurrency(16)
    control.retracted(5)
    assert control.observe(Load(running=16, waiting=40), in_flight=16) == 16
    assert control.observe(Load(running=2, waiting=0), in_flight=16) == 16


def test_auto_doubles_while_the_server_has_room_then_holds_the_queue_at_its_target():
    control = Concurrency(1000, auto=True, queue_target=2, start=8)
    limits = []
    for _ in range(4):  # the server runs all it is sent, nothing waits
        limits.append(control.observe(Load(running=control.limit, waiting=0), in_flight=control.limit))
    assert limits == [16, 32, 64, 128]
    # The server runs at most 100: the rest wait; the limit comes down to 100 running + 2 waiting.
    assert control.observe(Load(running=100, waiting=28), in_flight=128) == 102
    assert not control.slow_start
    # From then on, the limit grows by small steps only while every slot is in use and the queue is short.
    assert control.observe(Load(running=100, waiting=2), in_flight=102) == 102 + 5
    assert control.observe(Load(running=100, waiting=1), in_flight=50) == 107  # slots free: no reason to grow
    assert control.observe(Load(running=100, waiting=9), in_flight=107) == 100


def test_auto_backs_off_on_retractions_below_what_was_running():
    control = Concurrency(1000, auto=True, queue_target=2, start=200)
    control.retracted(3)
    assert control.observe(Load(running=150, waiting=0), in_flight=200) == int((150 + 2) * 0.8)
    assert control.retractions == 3 and control.cuts == 1
    # Retractions are counted once: the next reading with room grows again, by a step.
    assert control.observe(Load(running=121, waiting=0), in_flight=121) == 121 + 6
    assert Concurrency(1000, auto=True, start=4).observe(Load(running=1000, waiting=0), in_flight=4) == 8
    assert Concurrency(10, auto=True, start=8).observe(Load(running=8, waiting=0), in_flight=8) == 10  # the cap


def test_the_queue_target_is_per_data_parallel_rank():
    control = Concurrency(1000, auto=True, queue_target=2, start=64)
    control.slow_start = False
    # Four ranks, 8 waiting in all: 2 per rank, on target: every slot in use, so it grows a step.
    assert control.observe(Load(running=56, waiting=8, ranks=4), in_flight=64) == 67


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
