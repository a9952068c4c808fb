"""SGLang 0.5.23's native `/generate` wire format, as pure functions.

Everything here mirrors a named place in SGLang's source (paths under `python/sglang/`), so that the
CPU engine answers exactly as a real server would:

- `api/v1/api_types.py` + `srt/entrypoints/api_contract.py`: the request-schema check; its text is the
  body of a 400 `{"error": "<text>"}` (unknown `sampling_params` keys, wrong JSON types).
- `srt/managers/io_struct.py` `GenerateReqInput.normalize_batch_and_arguments`: single vs batch,
  rid expansion, `n > 1`.
- `srt/managers/tokenizer_manager.py` `_validate_one_request`, `_init_req_state`: context-length and
  duplicate-rid errors, 400 `{"error": {"message": ...}}` (`http_server._create_error_response`).
- `srt/sampling/sampling_params.py`: defaults, greedy rule, `verify()` texts.
- `srt/managers/schedule_batch.py` `FINISH_*.to_json`, `Req.update_finish_state`: finish reasons.
- `srt/managers/detokenizer_manager.py` `trim_matched_stop`: how `text` drops the matched stop.
- `srt/managers/scheduler.py` `init_req_max_new_tokens`: the clamp of `max_new_tokens` to the context.

No aiohttp and no torch here: the server and both backends build on these functions.
"""

import dataclasses
import json
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.settings import SGLANG_VERSION as SGLANG_VERSION  # the wire format's version

TOP_K_ALL = 1 << 30
SAMPLING_EPS = 1e-6
MAX_STOP_COUNT = 32
DEFAULT_WEIGHT_VERSION = "default"

# `_FIELDS_SamplingParams` of sglang/api/v1/api_types.py (0.5.23), in its order: the order matters,
# it is the list printed in the unknown-field error.
SAMPLING_PARAM_FIELDS: tuple[str, ...] = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip

# Defaults of `SamplingParams` in srt/sampling/sampling_params.py (top_k -1 is stored as TOP_K_ALL).
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "stream_interval": None,
    "logit_bias": None,
    "sampling_seed": None,
    "custom_params": None,
    "beam_width": None,
    "watermark": None,
    "choice": None,
}


class RequestError(Exception):
    """A request the server refuses: `status` and the JSON `body` to answer with."""

    def __init__(self, body: dict[str, Any], status: int = 400):
        super().__init__(json.dumps(body))
        self.body = body
        self.status = status

    @property
    def message(self) -> str:
        err = self.body.get("error", self.body.get("detail"))
        if isinstance(err, dict):
            return str(err.get("message"))
        return str(err)


def error_body(message: str) -> dict[str, Any]:
    """`http_server._create_error_response`: a ValueError from the tokenizer manager."""
    return {"error": {"message": message}}


def http_exception_body(message: str, status: int) -> dict[str, Any]:
    """`http_server`'s handler of a `fastapi.HTTPException` (a 5xx abort of `_handle_abort_finish_reason`):
    the OpenAI-style `ErrorResponse` of entrypoints/openai/protocol.py."""
    return {"object": "error", "message": message, "type": str(status), "param": None, "code": status}


def contract_error_body(text: str) -> dict[str, Any]:
    """`http_server.generate_request`: the request-schema check's refusal."""
    return {"error": text}


def value_error(message: str) -> RequestError:
    return RequestError(error_body(message), 400)


# ---------------------------------------------------------------------------------------------
# The 0.5.23 request-schema check (api_types.py: serde's texts, reproduced for the keys we see).


class ContractError(ValueError):
    pass


def _unexpected(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _invalid_type(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")


def unknown_field_text(key: str, fields: Sequence[str]) -> str:
    """serde's `unknown_field` text (api_types.py `_unknown_field`)."""
    if not fields:
        return f"unknown field `{key}`, there are no fields"
    if len(fields) == 1:
        return f"unknown field `{key}`, expected `{fields[0]}`"
    if len(fields) == 2:
        return f"unknown field `{key}`, expected `{fields[0]}` or `{fields[1]}`"
    listed = ", ".join(f"`{f}`" for f in fields)
    return f"unknown field `{key}`, expected one of {listed}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _expect(ok: bool, v: Any, expected: str) -> None:
    if not ok:
        raise _invalid_type(v, expected)


def _check_seq(v: Any, elem: Callable[[Any], None]) -> None:
    _expect(isinstance(v, list), v, "a sequence")
    for e in v:
        elem(e)


def _int(e: Any) -> None:
    _expect(_is_int(e), e, "i64")


def _str(e: Any) -> None:
    _expect(isinstance(e, str), e, "a string")


def _check_string_or_list(v: Any, name: str) -> None:
    if isinstance(v, list):
        _check_seq(v, _str)
    else:
        _expect(isinstance(v, str), v, f"a value or an array of values for {name}")


def _check_sampling_params(value: Any) -> None:
    _expect(isinstance(value, dict), value, "struct SamplingParams")
    kinds = {
        "max_new_tokens": "int", "stop_token_ids": "intlist", "temperature": "float",
        "top_p": "float", "top_k": "int", "min_p": "float", "frequency_penalty": "float",
        "presence_penalty": "float", "repetition_penalty": "float", "min_new_tokens": "int",
        "n": "int", "json_schema": "str", "regex": "str", "ebnf": "str", "structural_tag": "str",
        "ignore_eos": "bool", "skip_special_tokens": "bool",
        "spaces_between_special_tokens": "bool", "no_stop_trim": "bool",
        "stream_interval": "int", "sampling_seed": "int",
        "beam_width": "int", "stop": "strlist", "stop_regex": "strlist",
        "logit_bias": "floatmap", "custom_params": "any", "watermark": "any", "choice": "strseq",
    }  # fmt: skip
    for key, x in value.items():
        if key not in SAMPLING_PARAM_FIELDS:
            raise ContractError(unknown_field_text(key, SAMPLING_PARAM_FIELDS))
        if x is None:
            continue
        kind = kinds[key]
        if kind == "int":
            _expect(_is_int(x), x, "i64")
        elif kind == "float":
            _expect(_is_number(x), x, "f64")
        elif kind == "bool":
            _expect(isinstance(x, bool), x, "a boolean")
        elif kind == "str":
            _expect(isinstance(x, str), x, "a string")
        elif kind == "intlist":
            _check_seq(x, _int)
        elif kind == "strlist":
            _check_string_or_list(x, "StringOrList")
        elif kind == "strseq":
            _check_seq(x, _str)
        elif kind == "floatmap":
            _expect(isinstance(x, dict), x, "a map")
            for e in x.values():
                _expect(_is_number(e), e, "f64")


def _all_ints(v: list) -> bool:
    """Every element a JSON integer (bools excluded): the common case, checked at C speed."""
    return all(type(e) is int for e in v)


def _check_token_ids_or_list(v: Any) -> None:
    _expect(isinstance(v, list), v, "a value or an array of values for TokenIdsOrList")
    if not v or _is_number(v[0]):
        if not _all_ints(v):
            _check_seq(v, _int)
    else:
        for row in v:
            if not (isinstance(row, list) and _all_ints(row)):
                _check_seq(row, _int)


def contract_error(body: Any) -> str | None:
    """The schema violation in a parsed `/generate` body, or None (api_contract.py).

    Top-level keys the schema does not know are ignored, as in 0.5.23; unknown keys inside
    `sampling_params` are refused.
    """
    try:
        _expect(isinstance(body, dict), body, "struct GenerateRequest")
        for key, x in body.items():
            if x is None:
                continue
            if key in ("rid", "text"):
                _check_string_or_list(x, "StringOrList")
            elif key == "input_ids":
                _check_token_ids_or_list(x)
            elif key == "stream":
                _expect(isinstance(x, bool), x, "a boolean")
            elif key == "sampling_params":
                if isinstance(x, list):
                    for e in x:
                        _check_sampling_params(e)
                else:
                    _expect(
                        isinstance(x, dict),
                        x,
                        "a value or an array of values for SamplingParamsOrList",
                    )
                    _check_sampling_params(x)
    except ContractError as e:
        return str(e)
    return None


# ---------------------------------------------------------------------------------------------
# Sampling parameters (srt/sampling/sampling_params.py).


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters after SGLang's `__post_init__` and `normalize`."""

    max_new_tokens: int | None = 128
    stop_strs: tuple[str, ...] = ()
    stop_token_ids: frozenset = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        """SGLang samples greedily when top_k is 1 (temperature < 1e-6 sets it)."""
        return self.top_k == 1

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None) -> "SamplingParams":
        """Build from the request's dict: None means default, as in `__post_init__`."""
        raw = dict(raw or {})
        d = {k: v for k, v in SAMPLING_DEFAULTS.items()}
        for k, v in raw.items():
            if v is not None or k == "max_new_tokens":
                d[k] = v
        if "max_new_tokens" not in raw:
            d["max_new_tokens"] = 128
        stop = d["stop"]
        stop_strs = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if len(stop_strs) > MAX_STOP_COUNT:
            raise value_error(f"at most {MAX_STOP_COUNT} stop strings are allowed, got {len(stop_strs)}")
        stop_ids = frozenset(int(t) for t in (d["stop_token_ids"] or ()) if t is not None)
        temperature = float(d["temperature"])
        top_k = int(d["top_k"])
        if 0 <= temperature < SAMPLING_EPS:
            temperature, top_k = 1.0, 1
        if top_k == -1:
            top_k = TOP_K_ALL
        return cls(
            max_new_tokens=d["max_new_tokens"],
            stop_strs=stop_strs,
            stop_token_ids=stop_ids,
            temperature=temperature,
            top_p=float(d["top_p"]),
            top_k=top_k,
            min_p=float(d["min_p"]),
            frequency_penalty=float(d["frequency_penalty"]),
            presence_penalty=float(d["presence_penalty"]),
            repetition_penalty=float(d["repetition_penalty"]),
            min_new_tokens=int(d["min_new_tokens"]),
            n=int(d["n"]),
            ignore_eos=bool(d["ignore_eos"]),
            skip_special_tokens=bool(d["skip_special_tokens"]),
            spaces_between_special_tokens=bool(d["spaces_between_special_tokens"]),
            no_stop_trim=bool(d["no_stop_trim"]),
            logit_bias=d["logit_bias"] or None,
            sampling_seed=d["sampling_seed"],
        )

    def verify(self, vocab_size: int) -> None:
        """`SamplingParams.verify`: the same checks and texts (ValueError → HTTP 400)."""
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise value_error(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise value_error(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise value_error(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 or self.top_k == -1:
            raise value_error(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise value_error(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise value_error(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise value_error(
                f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}."
            )
        if not 0 <= self.min_new_tokens:
            raise value_error(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise value_error(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if not self.min_new_tokens <= self.max_new_tokens:
                raise value_error(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}."
                )
        if self.logit_bias is not None:
            for token_id in self.logit_bias:
                if not 0 <= int(token_id) < vocab_size:
                    raise value_error(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise value_error(f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}.")


# ---------------------------------------------------------------------------------------------
# Request parsing (io_struct.GenerateReqInput.normalize_batch_and_arguments).


@dataclasses.dataclass
class GenerateItem:
    """One single request of a `/generate` body, in input order."""

    index: int
    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]  # as received
    params: SamplingParams


@dataclasses.dataclass
class ParsedGenerate:
    items: list[GenerateItem]
    is_single: bool
    stream: bool


def parse_generate_body(
    body: Any,
    *,
    tokenize: Callable[[str], list[int]] | None = None,
    new_rid: Callable[[], str] = lambda: uuid.uuid4().hex,
) -> ParsedGenerate:
    """Split a `/generate` JSON body into single requests; raise RequestError as SGLang would.

    Runs the schema check first (400 `{"error": text}`), then the normalisation (400
    `{"error": {"message": ...}}`). Lengths and sampling values are checked later, per item, by
    `validate_item` (SGLang checks duplicate rids in between).
    """
    text = contract_error(body)
    if text is not None:
        raise RequestError(contract_error_body(text), 400)
    if body.get("input_embeds") is not None:
        raise value_error(
            "input_embeds is provided while disable_radix_cache is False. "
            "Please add `--disable-radix-cache` when you launch the server "
            "if you want to use input_embeds as inputs."
        )
    texts = body.get("text")
    input_ids = body.get("input_ids")
    if texts is None and input_ids is None:
        raise value_error("Either text, input_ids or input_embeds should be provided.")

    # _determine_batch_size: text decides the shape when both are given.
    if texts is not None:
        is_single = isinstance(texts, str)
        batch_size = 1 if is_single else len(texts)
    else:
        if len(input_ids) == 0:
            raise value_error("input_ids cannot be empty.")
        is_single = _is_int(input_ids[0])
        batch_size = 1 if is_single else len(input_ids)

    sp = body.get("sampling_params")
    if sp is None or isinstance(sp, dict):
        n = (sp or {}).get("n") or 1
    else:
        n = (sp[0].get("n") or 1) if sp else 1
        for s in sp:
            if (s.get("n") or 1) != n:
                raise value_error("The parallel_sample_num should be the same for all samples in sample params.")

    if is_single:
        prompts: list[Any] = [input_ids if input_ids is not None else texts]
    else:
        prompts = list(input_ids if input_ids is not None else texts)
        if input_ids is not None and prompts and not isinstance(prompts[0], list):
            raise value_error("input_ids should be a list of lists for batch processing.")
    if len(prompts) != batch_size:
        raise value_error("The length of input_ids should be equal to the batch size.")

    rid = body.get("rid")
    if is_single and n == 1:
        if isinstance(rid, list):
            raise value_error("The rid should be a string for a single request.")
        rids = [rid if rid is not None else new_rid()]
    else:
        if rid is None:
            rids = [new_rid() for _ in range(batch_size)]
        elif isinstance(rid, str):
            rids = [f"{rid}_{i}" for i in range(batch_size)]
        else:
            if len(rid) != batch_size:
                raise value_error("The specified rids length mismatch with the batch_size for batch processing.")
            rids = list(rid)
    if len(set(rids)) != len(rids):
        dups = [r for r in dict.fromkeys(rids) if rids.count(r) > 1]
        raise value_error(f"Duplicate request IDs detected within the request: {dups}")

    if sp is None or isinstance(sp, dict):
        sps = [dict(sp or {}) for _ in range(batch_size)]
    else:
        if is_single or len(sp) != batch_size:
            raise value_error("The length of sampling_params should be equal to the batch size.")
        sps = [dict(s) for s in sp]

    items: list[GenerateItem] = []
    for i in range(batch_size):
        prompt = prompts[i]
        if isinstance(prompt, str):
            if tokenize is None:
                raise value_error(
                    "The engine initialized with skip_tokenizer_init=True cannot accept text "
                    "prompts. Please provide input_ids or re-initialize the engine with "
                    "skip_tokenizer_init=False."
                )
            ids = list(tokenize(prompt))
        else:
            ids = list(prompt)
        if not ids and not is_single:
            raise value_error("input_ids cannot be empty.")
        params = SamplingParams.from_request(sps[i])
        items.append(GenerateItem(i, rids[i], ids, sps[i], params))

    if n > 1:
        # _handle_batch_request: each prompt is expanded n times, every copy gets a fresh uuid
        # rid, output order is [p0s0..p0s(n-1), p1s0, ...].
        expanded = []
        for item in items:
            for _ in range(n):
                expanded.append(
                    GenerateItem(len(expanded), new_rid(), item.input_ids, item.sampling_params,
                                 item.params)
                )  # fmt: skip
        return ParsedGenerate(expanded, False, bool(body.get("stream")))
    return ParsedGenerate(items, is_single, bool(body.get("stream")))


def validate_item(item: GenerateItem, *, context_len: int, vocab_size: int | None) -> None:
    """`_validate_one_request` (lengths) then `SamplingParams.verify`, for one item."""
    validate_lengths(len(item.input_ids), item.sampling_params.get("max_new_tokens"), context_len)
    ids = item.input_ids
    if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            # SGLang has no such check (an out-of-range id fails inside the model); the local
            # engine refuses it up front instead of crashing the worker.
            raise value_error(f"Token id {bad[0]} in input_ids is outside the vocabulary [0, {vocab_size}).")
    item.params.verify(vocab_size if vocab_size is not None else 1 << 62)


def validate_lengths(input_len: int, max_new_tokens: int | None, context_len: int) -> None:
    """tokenizer_manager._validate_one_request (0.5.23) without auto-truncation.

    `max_new_tokens` is the value the request sent (None when it sent none): SGLang checks the
    total only against an explicit value.
    """
    if input_len >= context_len:
        raise value_error(
            f"The input ({input_len} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if max_new_tokens is not None and (max_new_tokens + input_len) > context_len:
        total_tokens = max_new_tokens + input_len
        raise value_error(
            f"Requested token count exceeds the model's maximum context length "
            f"of {context_len} tokens. You requested a total of {total_tokens} "
            f"tokens: {input_len} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number "
            f"of tokens in the input messages or the completion to fit within the limit."
        )


def effective_max_new_tokens(input_len: int, max_new_tokens: int | None, context_len: int) -> int:
    """scheduler.init_req_max_new_tokens: clamp to `max_req_len - input_len - 1`.

    `max_req_len` is `context_len - 1` (a KV pool at least as large as the context), so a request
    that passes validation with input + max_new_tokens == context_len still ends 2 tokens early.
    """
    requested = max_new_tokens if max_new_tokens is not None else 1 << 30
    return max(0, min(requested, (context_len - 1) - input_len - 1))


# ---------------------------------------------------------------------------------------------
# Finish reasons (schedule_batch.py FINISH_*.to_json) and stopping (Req.update_finish_state).


def finish_matched_token(token_id: int) -> dict[str, Any]:
    return {"type": "stop", "matched": int(token_id)}


def finish_matched_str(stop_str: str) -> dict[str, Any]:
    return {"type": "stop", "matched": stop_str}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": int(length)}


def finish_abort(
    message: str | None = None, status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    """FINISH_ABORT: a running request aborted by /abort_request or a disconnect."""
    return {
        "type": "abort",
        "message": message or "Aborted",
        "status_code": status_code,
        "err_type": err_type,
    }


def finish_abort_waiting(message: str | None = None) -> dict[str, Any]:
    """tokenizer_manager._handle_abort_req: a request aborted before it ran."""
    return {"type": "abort", "message": message or "Abort in waiting queue"}


def stop_token_ids(eos_token_ids: Iterable[int], params: SamplingParams) -> frozenset:
    """The ids that end generation: the model's EOS set plus the request's `stop_token_ids`.

    `_check_token_based_finish` returns early under `ignore_eos`, so then no id stops at all —
    the request's own `stop_token_ids` included.
    """
    if params.ignore_eos:
        return frozenset()
    return frozenset(eos_token_ids) | params.stop_token_ids


def min_new_tokens_banned(eos_token_ids: Iterable[int], params: SamplingParams) -> frozenset:
    """Ids the min-new-tokens penalizer masks until `min_new_tokens` tokens exist."""
    return frozenset(eos_token_ids) | params.stop_token_ids


def check_finish(
    output_ids: Sequence[int],
    *,
    params: SamplingParams,
    stop_ids: frozenset,
    max_new_tokens: int,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> dict[str, Any] | None:
    """Finish reason after the last token of `output_ids` was appended, or None to go on.

    Order as `Req.update_finish_state`: stop string, then stop token, then length.
    """
    if params.stop_strs and decode is not None and output_ids:
        text = decode(output_ids)
        for s in params.stop_strs:
            if s and s in text:
                return finish_matched_str(s)
    if output_ids and output_ids[-1] in stop_ids:
        return finish_matched_token(output_ids[-1])
    if len(output_ids) >= max_new_tokens:
        return finish_length(max_new_tokens)
    return None


def text_ids(output_ids: Sequence[int], finish_reason: dict[str, Any] | None, no_stop_trim: bool):
    """The ids `text` is decoded from: a matched stop token is dropped unless `no_stop_trim`."""
    ids = list(output_ids)
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, int) and not isinstance(matched, bool) and not no_stop_trim and ids:
        return ids[:-1]
    return ids


def trim_stop_str(text: str, finish_reason: dict[str, Any] | None, no_stop_trim: bool) -> str:
    """detokenizer_manager.trim_matched_stop for a matched stop string."""
    matched = (finish_reason or {}).get("matched")
    if isinstance(matched, str):
        pos = text.find(matched)
        if pos == -1:
            return text
        return text[: pos + len(matched)] if no_stop_trim else text[:pos]
    return text


def decode_output_text(
    tokenizer: Any,
    output_ids: Sequence[int],
    finish_reason: dict[str, Any] | None,
    params: SamplingParams,
) -> str:
    """`text` of a response: decode as the detokenizer does, then trim the matched stop."""
    ids = text_ids(output_ids, finish_reason, params.no_stop_trim)
    text = tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
    return trim_stop_str(text, finish_reason, params.no_stop_trim)


def build_response(
    *,
    rid: str,
    text: str,
    output_ids: Sequence[int],
    finish_reason: dict[str, Any],
    prompt_tokens: int | None,
    cached_tokens: int = 0,
    num_retractions: int = 0,
    e2e_latency: float = 0.0,
    weight_version: str = DEFAULT_WEIGHT_VERSION,
    response_sent_ts: float | None = None,
    scheduler_metrics: dict[str, Any] | None = None,
    request_metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A non-streamed `/generate` answer for one request (tokenizer_manager._handle_batch_output).

    A request aborted before it ran has no `prompt_tokens` (`_handle_abort_req`): pass None. Every
    finished answer also carries `response_sent_to_client_ts` (wall-clock seconds), which 0.5.23's
    `_wait_one_response` adds last, once the request has finished (default: now).

    With `--enable-metrics` SGLang adds two groups of keys (`metrics_meta_info` builds them): the
    scheduler's time stats right after `num_retractions`, the tokenizer's after `e2e_latency`.
    """
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish_reason}
    if prompt_tokens is not None:
        meta.update(
            {"prompt_tokens": prompt_tokens, "weight_version": weight_version, "num_retractions": num_retractions}
        )
        if scheduler_metrics:
            meta.update(scheduler_metrics)
        meta.update({"reasoning_tokens": 0, "completion_tokens": len(output_ids), "cached_tokens": cached_tokens})
    else:
        meta.update({"weight_version": weight_version, "completion_tokens": len(output_ids)})
    meta["e2e_latency"] = e2e_latency
    if request_metrics and prompt_tokens is not None:
        meta.update(request_metrics)
    meta["response_sent_to_client_ts"] = time.time() if response_sent_ts is None else response_sent_ts
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def metrics_meta_info(
    *,
    received_ts: float,
    forward_entry_ts: float,
    prefill_finished_ts: float,
    queue_time: float,
    finished_ts: float,
    completion_tokens: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The `--enable-metrics` keys of a finished answer: (scheduler part, tokenizer part), wall-clock.

    Scheduler part: `SchedulerReqTimeStats.convert_to_output_meta_info`
    (srt/observability/req_time_stats.py): `storage_prefetch_wait` and `storage_staging_wait` (0.0:
    `set_wait_queue_entry_time` starts them with metrics on, no storage tier ever blocks here),
    `forward_entry_time`, `prefill_finished_time`, then `queue_time` (`queue_duration_s`: the time
    spent in the waiting queue, summed over every stay, retractions included).

    Tokenizer part: `APIServerReqTimeStats.convert_to_output_meta_info`: `request_received_ts`,
    `first_token_latency` (a non-streamed request's first token is the scheduler's
    `prefill_finished_time`, `_get_scheduler_first_token_time`), `api_server_dispatch_finish_ts`,
    `request_finished_ts`, and `decode_throughput` when more than one token was decoded over a
    positive time.
    """
    sched: dict[str, Any] = {"storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0}
    if forward_entry_ts > 0.0:
        sched["forward_entry_time"] = forward_entry_ts
    if prefill_finished_ts > 0.0:
        sched["prefill_finished_time"] = prefill_finished_ts
    sched["queue_time"] = queue_time
    req: dict[str, Any] = {"request_received_ts": received_ts}
    first = prefill_finished_ts if received_ts < prefill_finished_ts <= finished_ts else finished_ts
    if first > received_ts:
        req["first_token_latency"] = first - received_ts
    req["api_server_dispatch_finish_ts"] = received_ts
    req["request_finished_ts"] = finished_ts
    if completion_tokens > 1 and finished_ts - first > 0.0:
        req["decode_throughput"] = (completion_tokens - 1) / (finished_ts - first)
    return sched, req


class PreparedResponse:
    """A non-streamed answer serialized once, for answers that repeat (the scripted `--canned` mode).

    `render` fills in the per-request fields (`meta_info.id`, `prompt_tokens`, `e2e_latency`,
    `response_sent_to_client_ts`) and returns the bytes of exactly what `build_response` gives for
    the same values, in the same key order.
    """

    __slots__ = ("text", "output_ids", "finish_reason", "_head", "_mid", "_tail")

    def __init__(
        self,
        *,
        text: str,
        output_ids: Sequence[int],
        finish_reason: dict[str, Any],
        weight_version: str = DEFAULT_WEIGHT_VERSION,
    ):
        self.text = text
        self.output_ids = tuple(output_ids)
        self.finish_reason = finish_reason
        self._head = b'{"text":' + orjson.dumps(text) + b',"output_ids":' + orjson.dumps(list(output_ids))
        self._head += b',"meta_info":{"id":'
        self._mid = b',"finish_reason":' + orjson.dumps(finish_reason) + b',"prompt_tokens":'
        fixed = b',"num_retractions":0,"reasoning_tokens":0,"completion_tokens":%d,"cached_tokens":0,"e2e_latency":'
        self._tail = b',"weight_version":' + orjson.dumps(weight_version) + fixed % len(self.output_ids)

    def render(self, rid: str, prompt_tokens: int, e2e_latency: float, response_sent_ts: float) -> bytes:
        return b"".join(
            (
                self._head,
                orjson.dumps(rid),
                self._mid,
                b"%d" % prompt_tokens,
                self._tail,
                orjson.dumps(e2e_latency),
                b',"response_sent_to_client_ts":',
                orjson.dumps(response_sent_ts),
                b"}}",
            )
        )


# ---------------------------------------------------------------------------------------------
# Model facts.


# Turn-final markers SGLang adds to the tokenizer's stop ids when its added vocabulary holds them
# (0.5.23 `utils/hf_transformers/common.py` `attach_additional_stop_token_ids`).
ADDITIONAL_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")


def read_eos_token_ids(
    model_dir: Path | None, tokenizer_eos_id: int | None, added_vocab: dict[str, int] | None = None
) -> frozenset:
    """model_config._get_hf_eos_token_id plus what `Req._check_token_based_finish` adds from the
    tokenizer: its `eos_token_id` and `additional_stop_token_ids`.

    Union of config.json and generation_config.json `eos_token_id` (int or list), the tokenizer's
    eos id, and the additional turn-final markers found in its added vocabulary.
    """
    ids: set = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name if model_dir is not None else None
        if path is None or not path.is_file():
            continue
        value = json.loads(path.read_text()).get("eos_token_id")
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if tokenizer_eos_id is not None:
        ids.add(int(tokenizer_eos_id))
    ids.update(added_vocab[text] for text in ADDITIONAL_STOP_TEXTS if text in (added_vocab or {}))
    return frozenset(int(i) for i in ids)
