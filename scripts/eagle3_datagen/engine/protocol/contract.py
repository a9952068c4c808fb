"""The 0.5.23 request-schema check of a `/generate` body (`api/v1/api_types.py` +
`srt/entrypoints/api_contract.py`): serde's texts, reproduced for the keys we see.

Its text is the body of a 400 `{"error": "<text>"}` (unknown `sampling_params` keys, wrong JSON
types). Imports nothing of the engine.
"""

from collections.abc import Callable, Sequence
from typing import Any

# `_FIELDS_SamplingParams` of sglang/api/v1/api_types.py (0.5.23), in its order: the order matters,
# it is the list printed in the unknown-field error.
SAMPLING_PARAM_FIELDS: tuple[str, ...] = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip


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


def is_json_int(v: Any) -> bool:
    """A JSON integer: an int that is not a bool."""
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
    _expect(is_json_int(e), e, "i64")


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
            _expect(is_json_int(x), x, "i64")
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
