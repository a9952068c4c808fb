"""A `/generate` body split into single requests and checked, as SGLang 0.5.23 does it.

- `srt/managers/io_struct.py` `GenerateReqInput.normalize_batch_and_arguments`: single vs batch,
  rid expansion, `n > 1` (`parse_generate_body`).
- `srt/managers/tokenizer_manager.py` `_validate_one_request`: context-length errors, then
  `SamplingParams.verify` (`validate_item`).
- `srt/managers/scheduler.py` `init_req_max_new_tokens`: the clamp of `max_new_tokens` to the
  context (`effective_max_new_tokens`).

Imports `protocol.errors`, `protocol.contract` and `protocol.sampling`.
"""

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from eagle3_datagen.engine.protocol.contract import contract_error, is_json_int
from eagle3_datagen.engine.protocol.errors import RequestError, contract_error_body, value_error
from eagle3_datagen.engine.protocol.sampling import SamplingParams


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
    is_single, batch_size = _batch_shape(texts, input_ids)
    sp = body.get("sampling_params")
    n = _parallel_sample_num(sp)
    prompts = _prompts(texts, input_ids, is_single, batch_size)
    rids = _rids(body.get("rid"), is_single=is_single, n=n, batch_size=batch_size, new_rid=new_rid)
    sps = _sampling_dicts(sp, is_single, batch_size)
    items = [_item(i, prompts[i], rids[i], sps[i], is_single, tokenize) for i in range(batch_size)]
    stream = bool(body.get("stream"))
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
        return ParsedGenerate(expanded, False, stream)
    return ParsedGenerate(items, is_single, stream)


def _batch_shape(texts: Any, input_ids: Any) -> tuple[bool, int]:
    """`_determine_batch_size`: (is_single, batch_size); text decides the shape when both are given."""
    if texts is not None:
        is_single = isinstance(texts, str)
        return is_single, 1 if is_single else len(texts)
    if len(input_ids) == 0:
        raise value_error("input_ids cannot be empty.")
    is_single = is_json_int(input_ids[0])
    return is_single, 1 if is_single else len(input_ids)


def _parallel_sample_num(sp: Any) -> int:
    """`n`, which every entry of a list of sampling params must agree on."""
    if sp is None or isinstance(sp, dict):
        return (sp or {}).get("n") or 1
    n = (sp[0].get("n") or 1) if sp else 1
    for s in sp:
        if (s.get("n") or 1) != n:
            raise value_error("The parallel_sample_num should be the same for all samples in sample params.")
    return n


def _prompts(texts: Any, input_ids: Any, is_single: bool, batch_size: int) -> list[Any]:
    """One prompt (a text or a list of ids) per single request."""
    if is_single:
        prompts: list[Any] = [input_ids if input_ids is not None else texts]
    else:
        prompts = list(input_ids if input_ids is not None else texts)
        if input_ids is not None and prompts and not isinstance(prompts[0], list):
            raise value_error("input_ids should be a list of lists for batch processing.")
    if len(prompts) != batch_size:
        raise value_error("The length of input_ids should be equal to the batch size.")
    return prompts


def _rids(rid: Any, *, is_single: bool, n: int, batch_size: int, new_rid: Callable[[], str]) -> list[str]:
    """The rid of each single request: as sent, `<rid>_<i>` for one string in a batch, else fresh uuids."""
    if is_single and n == 1:
        if isinstance(rid, list):
            raise value_error("The rid should be a string for a single request.")
        rids = [rid if rid is not None else new_rid()]
    elif rid is None:
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
    return rids


def _sampling_dicts(sp: Any, is_single: bool, batch_size: int) -> list[dict[str, Any]]:
    """The sampling params dict of each single request, as received."""
    if sp is None or isinstance(sp, dict):
        return [dict(sp or {}) for _ in range(batch_size)]
    if is_single or len(sp) != batch_size:
        raise value_error("The length of sampling_params should be equal to the batch size.")
    return [dict(s) for s in sp]


def _item(
    index: int,
    prompt: Any,
    rid: str,
    sampling_params: dict[str, Any],
    is_single: bool,
    tokenize: Callable[[str], list[int]] | None,
) -> GenerateItem:
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
    return GenerateItem(index, rid, ids, sampling_params, SamplingParams.from_request(sampling_params))


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
