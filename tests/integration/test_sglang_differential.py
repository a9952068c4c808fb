"""The local engine held to the real thing: the same requests sent to a real SGLang 0.5.23 server and
to the local engine (model backend), both serving the demo model with a context of 2048 tokens, and
what the client depends on compared: status codes, the keys of every answer and their order, value
types, finish reasons, output lengths against finish reasons, `text` against `output_ids` decoded as
SGLang decodes them, and, for refusals and the other routes, the status and what the client's own
readers (`generation.answers.interpret`, `server_info.check_server_info`, `load.parse_loads`) make of
them (retryable or not, the fields they read), not SGLang's error texts; checks that must hold on
either server (`violations`). The facts of both servers are then compared, and the test fails listing every
difference at once. A difference that is not a defect of the local engine is listed, with its
reason, in `KNOWN_DIFFERENCES` (its path, a glob); `NORMALIZED` lists what is normalized away before
comparing. Greedy token values are not compared (both backends run the same float32 weights, so
they usually agree); whether they did is printed.
"""

import http.client
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import orjson
import pytest

from eagle3_datagen.engine.model import ModelBackend
from eagle3_datagen.generation.answers import FinalError, RetryableError, interpret
from eagle3_datagen.generation.load import parse_loads
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.server_info import check_server_info, served_context
from engine_thread import running_engine
from polling import wait_until
from real_sglang import real_server

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

CONTEXT = 2048
EOS = 163586  # <|im_end|>: generation_config.json's eos_token_id (config.json names 163585)
VOCAB = 163840
UUID_HEX = re.compile(r"[0-9a-f]{32}")
ABSENT = "<absent>"

# Differences that are not defects of the local engine: path glob -> why it cannot or should not match
# (none now: only what the client depends on is compared).
KNOWN_DIFFERENCES: dict[str, str] = {}
# What is normalized away before comparing, and why.
NORMALIZED = {
    "e2e_latency, response_sent_to_client_ts, cached_tokens": (
        "times, prefix-cache hits (the real server has a radix cache, the model backend none) and what each "
        "server was started with: only their types are compared; cached_tokens_details (null or a dict by the "
        "cache hit) is checked against cached_tokens on each server instead"
    ),
    "output_ids values, output length of an aborted request": (
        "sampled values may differ between backends in principle; an abort lands after however many "
        "tokens each server had decoded"
    ),
}


# ---------------------------------------------------------------------------------------------
# HTTP


@dataclass
class Reply:
    status: int
    content_type: str | None
    raw: bytes

    @property
    def body(self) -> Any:
        try:
            return orjson.loads(self.raw)
        except orjson.JSONDecodeError:
            return self.raw.decode("utf-8", errors="replace")


def call(url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         content_type: str | None = "application/json", timeout_s: float = 300) -> Reply:  # fmt: skip
    """One request with exactly these bytes and headers (`raw` wins over `body`; no Content-Type
    header at all when `content_type` is None)."""
    data = raw if raw is not None else (None if body is None else orjson.dumps(body))
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        if data is not None:
            if content_type is not None:
                conn.putheader("Content-Type", content_type)
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        resp = conn.getresponse()
        return Reply(resp.status, resp.getheader("Content-Type"), resp.read())
    finally:
        conn.close()


@dataclass
class Server:
    """One server under test, with what its probes learn on the way (its first greedy token) and
    the token values of its greedy answers (reported, not compared)."""

    name: str
    url: str
    tokenizer: Any
    prompt: list[int]
    first_token: int | None = None
    tokens: dict[str, list[int]] = field(default_factory=dict)

    def generate(self, body: Any, **kw) -> Reply:
        return call(self.url, "POST", "/generate", body, **kw)

    def get(self, path: str) -> Reply:
        return call(self.url, "GET", path)


# ---------------------------------------------------------------------------------------------
# Facts


def type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def shape(v: Any) -> Any:
    """The value types of a JSON value, dicts walked (a list is just "list")."""
    return {k: shape(x) for k, x in v.items()} if isinstance(v, dict) else type_name(v)


def decode(tokenizer, ids, *, skip_special_tokens: bool) -> str:
    """`ids` decoded as SGLang's detokenizer decodes them (clean-up off, spaces between specials)."""
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=True,
                            clean_up_tokenization_spaces=False)  # fmt: skip


def text_form(server: Server, ans: dict, params: dict) -> str:
    """Which decode of the output ids the answer's `text` is."""
    ids, text = ans.get("output_ids") or [], ans.get("text")
    skip = params.get("skip_special_tokens", True)
    forms = {"decode(output_ids)": ids, "decode(output_ids[:-1])": ids[:-1]}
    for name, part in forms.items():
        if text == decode(server.tokenizer, part, skip_special_tokens=skip):
            return name
    return f"none of {list(forms)}: {text!r}"


def violations(ans: dict, *, params: dict, prompt_len: int | None, rid: str | None) -> list[str]:
    """What must hold of an answer on either server."""
    meta, ids = ans.get("meta_info") or {}, ans.get("output_ids") or []
    finish = meta.get("finish_reason") or {}
    found = []
    if meta.get("completion_tokens") != len(ids):
        found.append(f"completion_tokens {meta.get('completion_tokens')} != {len(ids)} output ids")
    if prompt_len is not None and "prompt_tokens" in meta and meta["prompt_tokens"] != prompt_len:
        found.append(f"prompt_tokens {meta['prompt_tokens']} != {prompt_len}")
    if len(ids) > params.get("max_new_tokens", 128):
        found.append(f"{len(ids)} output ids > max_new_tokens")
    if finish.get("type") == "length" and not len(ids) == finish.get("length") == params.get("max_new_tokens"):
        found.append(f"finish length {finish.get('length')} with {len(ids)} output ids")
    matched = finish.get("matched")
    if finish.get("type") == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
        found.append(f"matched {matched} is not the last output id")
    spans = meta.get("weight_versions")
    if "weight_versions" in meta and spans != [{"version": "default", "start": 0, "end": len(ids)}]:
        found.append(f"weight_versions {spans}")
    cached = meta.get("cached_tokens")
    details = meta.get("cached_tokens_details")
    if "cached_tokens_details" in meta and details != ({"device": cached, "host": 0} if cached else None):
        found.append(f"cached_tokens_details {details} with cached_tokens {cached}")
    if rid is not None and meta.get("id") != rid:
        found.append(f"id {meta.get('id')!r} != rid {rid!r}")
    if rid is None and not UUID_HEX.fullmatch(str(meta.get("id"))):
        found.append(f"id {meta.get('id')!r} is not a uuid4 hex")
    return found


# null without a prefix-cache hit, else a dict: checked against cached_tokens by `violations` instead.
VARYING = {"cached_tokens_details"}


def answer_facts(server: Server, ans: Any, *, params: dict, prompt_len: int | None, rid: str | None,
                 stop_ids=()) -> dict:  # fmt: skip
    if not isinstance(ans, dict):
        return {"answer": shape(ans)}
    meta = ans.get("meta_info") or {}
    finish = dict(meta.get("finish_reason") or {})
    matched = finish.get("matched")
    if isinstance(matched, int):
        finish["matched"] = "<eos>" if matched == EOS else "<stop id>" if matched in stop_ids else "<other id>"
    return {
        "keys": list(ans),
        "meta_keys": list(meta),
        "meta_types": {k: type_name(v) for k, v in meta.items() if k not in VARYING},
        "finish_reason": finish,
        "text": text_form(server, ans, params),
        "violations": violations(ans, params=params, prompt_len=prompt_len, rid=rid),
    }


def reply_facts(reply: Reply) -> dict:
    """An answer's status, and its content type where it succeeded (a refusal's text is the server's own)."""
    return {"status": reply.status, "content_type": reply.content_type if reply.status == 200 else "-"}


def client_outcome(reply: Reply, max_new_tokens: int) -> str:
    """What the client's reader makes of a single answer: its result fields, or its error class."""
    req = Request(id="d", sample_index=0, prompt_ids=[1], max_new_tokens=max_new_tokens, seed=0)
    try:
        result = interpret(reply.status, reply.raw, req, VOCAB)
    except (FinalError, RetryableError) as e:
        return type(e).__name__
    return ", ".join(f"{k}: {type_name(v)}" for k, v in result.items())


# ---------------------------------------------------------------------------------------------
# Probes: each sends its requests to one server and returns its facts


def fill(value: Any, server: Server) -> Any:
    """A body with the server's own values in: "<prompt>" (the chat prompt), "<first>" (its first
    greedy token)."""
    if value == "<prompt>":
        return server.prompt
    if value == "<first>":
        return server.first_token
    if isinstance(value, dict):
        return {k: fill(v, server) for k, v in value.items()}
    return [fill(v, server) for v in value] if isinstance(value, list) else value


def generate_probe(body: dict, *, greedy=True, record_first=False):
    """A /generate body and the facts of its answer."""

    def run(server: Server, name: str) -> dict:
        sent = fill(body, server)
        reply = server.generate(sent)
        facts = reply_facts(reply)
        ids, params = sent.get("input_ids"), sent.get("sampling_params") or {}
        facts["client"] = client_outcome(reply, params.get("max_new_tokens", 128))
        if reply.status != 200:
            return facts
        ans = reply.body
        facts["answer"] = answer_facts(server, ans, params=params, prompt_len=len(ids), rid=sent.get("rid"),
                                       stop_ids=params.get("stop_token_ids") or ())  # fmt: skip
        if greedy:
            server.tokens[name] = ans.get("output_ids")
        if record_first:
            server.first_token = ans["output_ids"][0]
        return facts

    return run


def client_probe(max_new_tokens: int, rid: str):
    """A body exactly as the client builds it (generation.requests.RequestTemplate)."""

    def run(server: Server, name: str) -> dict:
        template = RequestTemplate(sampling={"temperature": 0.0}, stop_token_ids=[EOS], vocab_size=VOCAB)
        req = Request(id="diff", sample_index=0, prompt_ids=server.prompt, max_new_tokens=max_new_tokens, seed=5)
        raw = template.body(req, rid)
        reply = server.generate(None, raw=raw)
        facts = reply_facts(reply)
        if reply.status == 200:
            params = template.sampling_params(req)
            facts["answer"] = answer_facts(server, reply.body, params=params, prompt_len=len(req.prompt_ids),
                                           rid=rid, stop_ids=[EOS])  # fmt: skip
            facts["ids_are_compact"] = b'"output_ids":[' in reply.raw
            server.tokens[name] = reply.body.get("output_ids")
        facts["client"] = client_outcome(reply, max_new_tokens)
        return facts

    return run


def raw_probe(method: str, path: str, body: Any = None, **kw):
    def run(server: Server, name: str) -> dict:
        return reply_facts(call(server.url, method, path, body, **kw))

    return run


def info_probe(server: Server, name: str) -> dict:
    """/server_info and /model_info: what the client reads of them."""
    info, model = server.get("/server_info"), server.get("/model_info")
    si, mi = info.body, model.body
    client_fields = ("context_length", "max_req_input_len", "allow_auto_truncate", "reasoning_parser",
                     "tool_call_parser", "skip_tokenizer_init", "enable_deterministic_inference",
                     "incremental_streaming_output")  # fmt: skip
    try:
        check = check_server_info(si, context_length=CONTEXT, url="u")
    except RuntimeError as e:
        check = f"refused: {e}"
    return {
        "status": [info.status, model.status],
        "content_type": [info.content_type, model.content_type],
        "client_fields": {k: si.get(k, ABSENT) for k in client_fields},
        "served_context": served_context(si),
        "check_server_info": check,
        "model_client_fields": {k: type_name(mi.get(k)) for k in ("is_generation", "model_path", "tokenizer_path")},
        "model_identity": {k: mi.get(k) for k in ("is_generation", "model_type", "architectures")},
    }


def loads_facts(reply: Reply) -> dict:
    """What the client reads of /v1/loads (`load.parse_loads`)."""
    load = parse_loads(reply.body)
    return {
        "status": reply.status,
        "client": {
            "running": load.running,
            "waiting": load.waiting,
            "ranks": load.ranks,
            "used_tokens": type_name(load.used_tokens),
        },  # fmt: skip
    }


def inflight_probe(server: Server, name: str) -> dict:
    """A long request in flight under rid X: the load while it runs, a second request with rid X, an
    abort of an unknown rid and of X, and X's own answer."""
    rid = "diff-long"
    body = {"input_ids": [1, 2, 3, 4], "rid": rid,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True, "temperature": 0}}  # fmt: skip
    done = {}
    thread = threading.Thread(target=lambda: done.update(reply=server.generate(body)), daemon=True)
    thread.start()
    facts = {}
    try:
        busy = wait_until(lambda: running(server), f"{server.name}: {rid} to run", timeout_s=120)
        facts["loads_busy"] = loads_facts(busy)
        duplicate = {"input_ids": [5, 6], "rid": rid, "sampling_params": {"max_new_tokens": 2}}
        facts["duplicate_rid"] = reply_facts(server.generate(duplicate))
        facts["abort_unknown"] = reply_facts(call(server.url, "POST", "/abort_request", {"rid": "diff-none"}))
        facts["abort"] = reply_facts(call(server.url, "POST", "/abort_request", {"rid": rid}))
    finally:
        thread.join(300)
    reply = done["reply"]
    facts["aborted"] = reply_facts(reply)
    facts["aborted_answer"] = answer_facts(server, reply.body, params=body["sampling_params"], prompt_len=4, rid=rid)
    facts["loads_idle"] = loads_facts(wait_until(lambda: running(server, 0), f"{server.name}: idle", timeout_s=60))
    return facts


def sse_events(raw: bytes) -> tuple[list, bool]:
    """(chunks, framing ok) of a streamed answer: `data: <json>` events, `data: [DONE]` last."""
    parts = raw.split(b"\n\n")
    ok = raw.endswith(b"data: [DONE]\n\n") and all(p.startswith(b"data: ") for p in parts[:-1])
    chunks = [orjson.loads(p[6:]) for p in parts[:-1] if p.startswith(b"data: ") and p != b"data: [DONE]"]
    return chunks, ok


def chunk_facts(chunks: list, whole: dict | None, interval: int) -> dict:
    """What a stream's chunks say against the same request's non-streamed answer."""
    ids = [t for c in chunks for t in c.get("output_ids", [])]
    ends = [c["meta_info"]["completion_tokens"] for c in chunks if "meta_info" in c]
    facts = {
        "first_keys": list(chunks[0]), "first_meta_keys": list(chunks[0].get("meta_info", {})),
        "last_keys": list(chunks[-1]), "last_meta_keys": list(chunks[-1].get("meta_info", {})),
        "middle_finish": sorted({str(c["meta_info"]["finish_reason"]) for c in chunks[:-1]}),
        "several_chunks": len(chunks) > 2,
        "ends_follow_interval": bool(ends) and ends[0] == 1 and all((e - 1) % interval == 0 for e in ends[:-1]),
        "completion_tokens_is_total": bool(ends) and ends[-1] == len(ids),
    }  # fmt: skip
    if whole is not None:
        facts["ids_join_to_whole"] = ids == whole["output_ids"]
        facts["text_joins_to_whole"] = "".join(c["text"] for c in chunks) == whole["text"]
        facts["last_finish"] = chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    return facts


def stream_probe(max_new_tokens: int, interval: int):
    """A greedy request streamed (incremental), and the same request not streamed."""

    def run(server: Server, name: str) -> dict:
        body = greedy(max_new_tokens, params={"stream_interval": interval, "ignore_eos": True})
        whole = server.generate(fill(body, server)).body
        reply = server.generate(fill({**body, "stream": True}, server))
        chunks, framing = sse_events(reply.raw)
        return {"status": reply.status, "content_type": reply.content_type, "framing": framing,
                **chunk_facts(chunks, whole, interval)}  # fmt: skip

    return run


def stream_abort_probe(server: Server, name: str) -> dict:
    """A long greedy stream aborted by /abort_request after its first chunk."""
    rid, interval = "diff-stream-abort", 4
    body = {"input_ids": [1, 2, 3, 4], "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True, "temperature": 0,
                                "stream_interval": interval}}  # fmt: skip
    parsed = urllib.parse.urlparse(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
    try:
        conn.request("POST", "/generate", orjson.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = b""
        while not first.endswith(b"\n\n"):
            first += resp.readline()
        aborted = call(server.url, "POST", "/abort_request", {"rid": rid})
        raw = first + resp.read()
    finally:
        conn.close()
    chunks, framing = sse_events(raw)
    before, last = chunks[:-1], chunks[-1]
    sent = [t for c in before for t in c["output_ids"]]
    meta = last["meta_info"]
    return {
        "abort_status": aborted.status, "framing": framing, "last_keys": list(last), "last_meta_keys": list(meta),
        "last_finish": meta["finish_reason"], "done_after_abort_chunk": raw.endswith(b"}\n\ndata: [DONE]\n\n"),
        "unfinished_before": all(c["meta_info"]["finish_reason"] is None for c in before),
        "last_ids_repeat_the_last_sent": bool(sent) and last["output_ids"] == sent[-1:],
        "completion_tokens": "sent + last" if meta["completion_tokens"] == len(sent) + len(last["output_ids"])
        else "sent" if meta["completion_tokens"] == len(sent) else f"{meta['completion_tokens']} of {len(sent)} sent",
    }  # fmt: skip


def running(server: Server, n: int | None = None) -> Reply | None:
    """The /v1/loads reply once `n` requests run (at least one when n is None), else None."""
    reply = server.get("/v1/loads")
    count = reply.body["loads"][0]["num_running_reqs"]
    return reply if (count >= 1 if n is None else count == n) else None


def greedy(max_new_tokens: int, *, input_ids: Any = "<prompt>", **body) -> dict:
    """A greedy /generate body, on the chat prompt unless told otherwise; `params` go to sampling_params."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, **body.pop("params", {})}
    return {"input_ids": input_ids, "sampling_params": params, **body}


def refused(params: dict, **body) -> dict:
    """A body on a short prompt whose sampling params are refused."""
    return {"input_ids": [1, 2, 3], "sampling_params": params, **body}


LONG = [5] * 2100
JSON_BODY = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
PROBES = {
    # Answers: stop on a stop id, on the model's EOS, on length (batch bodies: the client sends none)
    "length_one": generate_probe(greedy(1), record_first=True),
    "client_body_eos": client_probe(32, "diff-eos"),
    "client_body_length": client_probe(8, "diff-len"),
    "eos_default_flags": generate_probe(greedy(32, rid="diff-eos2")),
    "stop_id_trimmed": generate_probe(greedy(32, params={"stop_token_ids": ["<first>"]})),
    "stop_id_kept": generate_probe(greedy(32, params={"stop_token_ids": ["<first>"], "no_stop_trim": True,
                                                      "skip_special_tokens": False})),
    "length": generate_probe(greedy(8, rid="diff-8")),
    "length_zero": generate_probe(greedy(0)),
    "sampled": generate_probe(greedy(8, params={"temperature": 0.8, "top_p": 0.9, "sampling_seed": 3}), greedy=False),
    # Refusals of /generate: lengths, sampling params, the body's fields
    "over_context": generate_probe(greedy(4, input_ids=LONG)),
    "over_context_total": generate_probe(greedy(32, input_ids=[5] * 2040)),
    "unknown_param": generate_probe(refused({"max_new_tokens": 4, "bogus": 1})),
    "temperature_negative": generate_probe(refused({"max_new_tokens": 4, "temperature": -1})),
    "top_p_zero": generate_probe(refused({"max_new_tokens": 4, "top_p": 0})),
    "top_k_zero": generate_probe(refused({"max_new_tokens": 4, "top_k": 0})),
    "max_new_tokens_negative": generate_probe(refused({"max_new_tokens": -1})),
    "min_over_max": generate_probe(refused({"max_new_tokens": 2, "min_new_tokens": 5})),
    "param_wrong_type": generate_probe(refused({"max_new_tokens": 4, "temperature": "hot"})),
    "param_float_for_int": generate_probe(refused({"max_new_tokens": 1.5})),
    "no_input": generate_probe({"sampling_params": {}}),
    "empty_input": raw_probe("POST", "/generate", {"input_ids": []}),
    "field_types": raw_probe("POST", "/generate", {"input_ids": [1, 2], "stream": "maybe", "rid": [1],
                                                   "sampling_params": [5]}),
    "input_ids_string": raw_probe("POST", "/generate", {"input_ids": "abc"}),
    "input_ids_mixed": raw_probe("POST", "/generate", {"input_ids": [1, "a"], "text": 7}),
    "stream_null": raw_probe("POST", "/generate", {"input_ids": [1], "stream": None}),
    # Malformed bodies
    "invalid_json": raw_probe("POST", "/generate", raw=b'{"input_ids": [1,2,'),
    "empty_body": raw_probe("POST", "/generate", raw=b""),
    "null_body": raw_probe("POST", "/generate", raw=b"null"),
    "list_body": raw_probe("POST", "/generate", raw=b"[1, 2]"),
    "text_plain_body": raw_probe("POST", "/generate", JSON_BODY, content_type="text/plain"),
    "no_content_type": raw_probe("POST", "/generate", JSON_BODY, content_type=None),
    # The other routes
    "abort_bad_rid": raw_probe("POST", "/abort_request", {"rid": 5}),
    "abort_no_body": raw_probe("POST", "/abort_request", raw=b""),
    "abort_invalid_json": raw_probe("POST", "/abort_request", raw=b"xx"),
    "abort_list": raw_probe("POST", "/abort_request", raw=b"[]"),
    "health": raw_probe("GET", "/health"),
    "health_generate": raw_probe("GET", "/health_generate"),
    "loads_bad_rank": raw_probe("GET", "/v1/loads?dp_rank=x"),
    "get_load": raw_probe("GET", "/get_load"),
    "not_found": raw_probe("GET", "/no_such_route"),
    "method_not_allowed": raw_probe("GET", "/generate"),
    "info": info_probe,
    # A request in flight: duplicate rid, abort, load
    "in_flight": inflight_probe,
    # Streams (both servers with --incremental-streaming-output)
    "stream": stream_probe(24, 1),
    "stream_interval": stream_probe(30, 8),
    "stream_abort": stream_abort_probe,
    "stream_refused": raw_probe("POST", "/generate", {"input_ids": LONG, "stream": True}),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Comparison


def differences(real: Any, local: Any, path: str) -> list[tuple[str, Any, Any]]:
    """(path, real, local) wherever the two differ; a key one side lacks is `<path> (absent ...)`."""
    if isinstance(real, dict) and isinstance(local, dict):
        found = []
        for key in [*real, *(k for k in local if k not in real)]:
            if key not in local:
                found.append((f"{path}/{key} (absent locally)", real[key], ABSENT))
            elif key not in real:
                found.append((f"{path}/{key} (absent on real)", ABSENT, local[key]))
            else:
                found += differences(real[key], local[key], f"{path}/{key}")
        return found
    return [] if real == local else [(path, real, local)]


def all_violations(facts: Any, path: str) -> list[str]:
    if not isinstance(facts, dict):
        return []
    found = [f"{path}: {v}" for v in facts.get("violations", [])]
    for key, value in facts.items():
        found += all_violations(value, f"{path}/{key}")
    return found


@pytest.fixture(scope="module")
def servers(tmp_path_factory, demo_model_dir):
    """The real server and the local engine, each serving the demo model with a 2048-token context."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    prompt = chat_prompt(tokenizer)
    log = tmp_path_factory.mktemp("sglang_differential") / "real_sglang.log"
    with real_server(demo_model_dir, log, context_length=CONTEXT, extra=["--incremental-streaming-output"]) as real_url:
        backend = ModelBackend(demo_model_dir, max_batch=4)
        with running_engine(backend, context_length=CONTEXT, incremental_streaming_output=True) as local_url:
            yield Server("real", real_url, tokenizer, prompt), Server("local", local_url, tokenizer, prompt)


def chat_prompt(tokenizer) -> list[int]:
    """The first conversation of config/prompts/chat.jsonl in the demo tokenizer's chat template:
    the demo model answers it greedily in 30 tokens ending with <|im_end|>."""
    first = Path(__file__).resolve().parents[2] / "config" / "prompts" / "chat.jsonl"
    messages = orjson.loads(first.read_text().splitlines()[0])["messages"]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def test_local_engine_answers_as_the_real_server(servers):
    real, local = servers
    observed = {name: (probe(real, name), probe(local, name)) for name, probe in PROBES.items()}
    found, broken, used = [], [], set()
    for name, (r, loc) in observed.items():
        broken += all_violations(r, f"{name} (real)") + all_violations(loc, f"{name} (local)")
        for path, rv, lv in differences(r, loc, name):
            known = next((p for p in KNOWN_DIFFERENCES if fnmatch(path, p)), None)
            if known is None:
                found.append(f"{path}: real {rv!r}, local {lv!r}")
            used.add(known)
    stale = sorted(set(KNOWN_DIFFERENCES) - used)
    same = {k: real.tokens[k] == local.tokens.get(k) for k in real.tokens}
    print(f"greedy token values equal on both servers: {sum(same.values())}/{len(same)}; differ: "
          f"{[k for k, v in same.items() if not v]}")  # fmt: skip
    assert observed["client_body_eos"][0]["answer"]["finish_reason"] == {"type": "stop", "matched": "<eos>"}, (
        "the prompt no longer ends with <|im_end|> on the real server: the EOS probe needs another prompt"
    )
    problems = [*(f"differs: {d}" for d in found), *(f"violated: {v}" for v in broken),
                *(f"KNOWN_DIFFERENCES entry matches nothing: {p!r}" for p in stale)]  # fmt: skip
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)


def test_the_client_refuses_the_real_server_when_the_config_names_another_tokenizer(
    servers, qwen3_tokenizer_dir, qwen3_tokenizer
):
    """The real server serves the demo model (the Kimi-shaped tokenizer); the job is configured with
    Qwen3's tokenizer, whose ordinary ids decode alike and whose special ids do not. The client must
    refuse the server on the text of its answers, with nothing journalled."""
    import tempfile

    from eagle3_datagen.generation.client import GenerateClient, run_loop
    from eagle3_datagen.generation.identity import AnswerCheck, ServerMismatch
    from eagle3_datagen.generation.journal import Journal
    from eagle3_datagen.settings import ClientSettings

    real, _ = servers
    requests = [Request(f"q{i}", 0, list(real.prompt), 24, i, fingerprint=f"f{i}") for i in range(8)]
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    template = RequestTemplate(sampling, stop_token_ids=[EOS], vocab_size=VOCAB)
    check = AnswerCheck(qwen3_tokenizer, tokenizer_dir=str(qwen3_tokenizer_dir))
    client = GenerateClient([real.url], template, ClientSettings.from_config(concurrency=4), answer_check=check)
    with tempfile.TemporaryDirectory() as tmp:
        journal_path = Path(tmp) / "journal.jsonl"
        with Journal(journal_path) as journal, pytest.raises(ServerMismatch) as refused:
            run_loop(client.run(requests, journal))
        assert journal_path.read_bytes() == b""
    message = str(refused.value)
    assert message.startswith(f"{real.url} answers as another model or tokenizer than the config's"), message
    assert f"model.tokenizer {qwen3_tokenizer_dir}" in message and "first differ at character" in message
