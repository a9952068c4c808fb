"""Whether a server is the one the config names, before any of its answers is kept: what its
`/model_info` and `/server_info` say at start-up, and the `text` of its first answers against the
job's own tokenizer (`model.tokenizer`).

Start-up (`check_model_info`): SGLang 0.5.23 publishes no vocabulary size, and the paths, names and
model family it gives cannot be compared with the config reliably (the same files mounted
elsewhere, a hub id, tokenizers shared across a family). So only a server that cannot serve this
job at all is refused (`is_generation` false; `skip_tokenizer_init`: answers without text), and the
identity it gives is logged.

Answers (`AnswerCheck`): our requests (`skip_special_tokens: false`, `no_stop_trim: true`, no stop
string) make an answer's `text` the output ids as the server's tokenizer decodes them, through
SGLang's incremental detokenizer (`sglang_text` does what it does, edges included); the ids decoded
whole, the local engine's text, are accepted too. A server's first `CHECKED_ANSWERS` ok answers are
checked and held (not journalled) until that many agree, or until nothing else can come: an answer
that agrees by chance is never kept from a server a later answer shows to be wrong.

Imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import orjson

log = logging.getLogger(__name__)

# A server's first answers checked against the job's tokenizer (each holds what a server answers
# for, so a few suffice), and held until they all agree.
CHECKED_ANSWERS = 8
# SGLang 0.5.23 schedule_batch.INIT_INCREMENTAL_DETOKENIZATION_OFFSET: the prompt ids the
# detokenizer decodes the first output tokens after.
SURROGATE_IDS = 5
# SGLang 0.5.23 SGLANG_FORCE_STREAM_INTERVAL (default): a request that is not streamed is sent to
# the detokenizer whenever its output reaches a multiple of this many tokens, and when it ends.
FORCE_STREAM_INTERVAL = 50
# sglang/utils.py `_is_chinese_char`: the CJK blocks `find_printable_text` prints up to.
CJK_BLOCKS = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
EXCERPT_CHARS = 24


class ServerMismatch(RuntimeError):
    """A server that is not the one the config names (another model or tokenizer): refused."""


def check_model_info(model_info: dict, server_info: dict, *, url: str, tokenizer: str) -> str:
    """Refuse (ServerMismatch) a server that cannot serve this job, by its start-up answers; else a
    log line with the identity it gives, and what is left to its answers to show."""
    if model_info.get("is_generation") is False:
        raise ServerMismatch(
            f"{url}: /model_info is_generation is false (server: model_path {model_info.get('model_path')!r}, "
            "an embedding or reward model) but must be true (config: the generating model of model.tokenizer "
            f"{tokenizer}); refusing it"
        )
    if server_info.get("skip_tokenizer_init"):
        raise ServerMismatch(
            f"{url}: /server_info skip_tokenizer_init is true (server) but must be false (config): its "
            f"answers carry no text, so its tokenizer cannot be checked against model.tokenizer {tokenizer}; "
            "refusing it"
        )
    return (
        f"{url} serves model_path {model_info.get('model_path')!r} (tokenizer_path "
        f"{model_info.get('tokenizer_path')!r}, model_type {model_info.get('model_type')!r}); its first "
        f"{CHECKED_ANSWERS} answers are checked against model.tokenizer {tokenizer}"
    )


def sglang_decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """`ids` decoded as SGLang 0.5.23's detokenizer decodes them for our requests (skip_special_tokens
    false): a fast tokenizer with keywords, a slow one without (`decode_without_hf_kwargs`), both
    with `clean_up_tokenization_spaces` off, as SGLang loads every tokenizer."""
    ids = list(ids)
    if getattr(tokenizer, "is_fast", False):
        return tokenizer.decode(
            ids, skip_special_tokens=False, spaces_between_special_tokens=True, clean_up_tokenization_spaces=False
        )
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer.decode(ids)
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def find_printable_text(text: str) -> str:
    """sglang/utils.py `find_printable_text`: what a piece ending in an incomplete character may
    already show (up to a newline, a CJK character, or the last space)."""
    if text.endswith("\n"):
        return text
    if text and any(lo <= ord(text[-1]) <= hi for lo, hi in CJK_BLOCKS):
        return text
    if len(text) > 1 and any(lo <= ord(text[-2]) <= hi for lo, hi in CJK_BLOCKS):
        return text[:-1]
    return text[: text.rfind(" ") + 1]


def sglang_text(
    tokenizer: Any,
    output_ids: Sequence[int],
    prompt_ids: Sequence[int] = (),
    interval: int = FORCE_STREAM_INTERVAL,
    streamed: bool = False,
) -> str:
    """The `text` of an answer, made as SGLang 0.5.23 makes it: the ids reach the detokenizer every
    `interval` tokens (a streamed answer: its first token too) and at the end (output_streamer
    `accept`), and detokenizer_manager `_decode_batch_token_id_output` turns each delivery into a
    piece, joined by the tokenizer manager.

    A piece is `decode(context + new)[len(decode(context)):]`, the first context being the prompt's
    last `SURROGATE_IDS` ids (a prompt ending inside a character changes the start); a piece ending
    in "\ufffd" (a character not complete yet) is not committed, and only its `find_printable_text`
    part is sent. That part can shrink from one such delivery to the next, and SGLang then sends the
    difference twice: text repeated where two deliveries in a row end inside a character (rare at
    50 tokens a delivery; reproduced here, not corrected)."""
    context = list(prompt_ids)[-SURROGATE_IDS:]
    ids = context + list(output_ids)
    surr, read = 0, len(context)
    decoded, sent, pieces = "", 0, []
    first = 1 if streamed else interval
    for end in [*range(first, len(output_ids), interval), len(output_ids)]:
        end += len(context)
        surr_text = sglang_decode(tokenizer, ids[surr:read])
        new_text = sglang_decode(tokenizer, ids[surr:end])[len(surr_text) :]
        if end == len(ids):  # finished: everything not sent yet
            pieces.append((decoded + new_text)[sent:])
        elif new_text and not new_text.endswith("\ufffd"):  # committed
            pending = sent - len(decoded)
            decoded += new_text
            surr, read, sent = read, end, len(decoded)
            pieces.append(new_text[pending:])
        else:  # an incomplete character at its end: only the printable part is sent
            pending = sent - len(decoded)
            printable = find_printable_text(new_text)
            sent = len(decoded) + len(printable)
            pieces.append(printable[pending:])
    return "".join(pieces)


def expected_texts(
    output_ids: Sequence[int],
    tokenizer: Any,
    prompt_ids: Sequence[int] | None = None,
    stream_interval: int | None = None,
) -> list[str]:
    """The texts a server on `tokenizer` may answer for `output_ids`: SGLang's (`sglang_text`; a
    streamed answer delivered every `stream_interval` tokens), and the ids decoded whole, as the
    local engine answers; one where they agree."""
    alone = sglang_decode(tokenizer, output_ids)
    interval = FORCE_STREAM_INTERVAL if stream_interval is None else max(1, stream_interval)
    sglang = sglang_text(tokenizer, output_ids, prompt_ids or (), interval, streamed=stream_interval is not None)
    return [sglang] if sglang == alone else [sglang, alone]


def excerpt(text: str, at: int) -> str:
    """A few characters of `text` either side of position `at`, quoted (escapes shown)."""
    start = max(0, at - EXCERPT_CHARS // 2)
    end = at + EXCERPT_CHARS // 2
    return ("…" if start else "") + repr(text[start:end]) + ("…" if end < len(text) else "")


def check_answer_text(
    server_text: Any,
    output_ids: Sequence[int],
    tokenizer: Any,
    *,
    prompt_ids: Sequence[int] | None = None,
    stream_interval: int | None = None,
) -> str | None:
    """None when a server's `text` is one of the `expected_texts` for `output_ids`; else why not, with
    the first differing position and the texts around it (against SGLang's text)."""
    if server_text is None:
        return "the answer has no `text` (a server started with --skip-tokenizer-init answers none)"
    if not isinstance(server_text, str):
        return f"the answer's `text` is a {type(server_text).__name__}, not a string"
    expected = expected_texts(output_ids, tokenizer, prompt_ids, stream_interval)
    if server_text in expected:
        return None
    ours = expected[0]
    at = len(os.path.commonprefix([server_text, ours]))  # where they first differ
    return (
        f"its text ({len(server_text)} characters) and the {len(output_ids)} output ids decoded by the config's "
        f"tokenizer ({len(ours)} characters) first differ at character {at}: server {excerpt(server_text, at)} "
        f"vs config {excerpt(ours, at)}"
    )


def answer_text(raw: bytes) -> Any:
    """The `text` of a /generate answer's bytes (None when it has none)."""
    data = orjson.loads(raw)
    return data.get("text") if isinstance(data, dict) else None


class AnswerCheck:
    """The first `answers` ok answers of each server, checked against the job's tokenizer
    (`check_answer_text`); each waits in `vet` until its server is confirmed (that many agreed) or
    `release` says nothing else can come. A mismatch refuses the server: ServerMismatch, in the
    answer's own request and in every answer of that server still waiting."""

    def __init__(self, tokenizer: Any, *, tokenizer_dir: str, answers: int = CHECKED_ANSWERS):
        self.tokenizer = tokenizer
        self.tokenizer_dir = tokenizer_dir
        self.answers = answers
        self.agreed: dict[str, int] = {}
        self.refused: dict[str, str] = {}
        self.released: dict[str, int] = {}  # answers kept by `release`, before their server was confirmed
        self.on_hold: Callable[[], None] | None = None  # told when an answer starts waiting
        self._held: list[tuple[str, asyncio.Future]] = []

    def wants(self, url: str) -> bool:
        """Whether an answer of `url` is still to be checked (and held)."""
        return url in self.refused or self.agreed.get(url, 0) < self.answers

    @property
    def holding(self) -> int:
        """How many answers wait for their server to be confirmed."""
        return sum(not future.done() for _, future in self._held)

    def record(self, url: str, rid: str, reason: str | None) -> None:
        """Count an answer of `url` that agreed (reason None), or refuse `url` for one that did not."""
        if url in self.refused:
            raise ServerMismatch(self.refused[url])
        if reason is not None:
            kept = self.released.get(url, 0)
            self.refused[url] = message = (
                f"{url} answers as another model or tokenizer than the config's: its answer to rid {rid}: "
                f"{reason} (model.tokenizer {self.tokenizer_dir}). Refusing this server: "
                + (
                    f"{kept} earlier answer(s) of it, each agreeing, were kept when nothing else could come"
                    if kept
                    else "none of its answers was kept"
                )
            )
            self._settle(url, message)
            raise ServerMismatch(message)
        self.agreed[url] = self.agreed.get(url, 0) + 1
        if self.agreed[url] == self.answers:
            log.info("%s: its first %d answers agree with model.tokenizer %s", url, self.answers, self.tokenizer_dir)
            self._settle(url, None)

    async def vet(
        self,
        url: str,
        rid: str,
        raw: bytes,
        output_ids: list[int],
        prompt_ids: list[int],
        pool,
        stream_interval: int | None = None,
    ) -> None:
        """Check one ok answer of `url` (in `pool`, a thread for the tokenizer; None: here) and return
        once it may be kept; ServerMismatch when it or its server is refused. `stream_interval`: the
        answer was streamed in chunks of that many tokens (its text was made as they were sent)."""
        if not self.wants(url):
            return
        check = partial(
            check_answer_text,
            answer_text(raw),
            output_ids,
            self.tokenizer,
            prompt_ids=prompt_ids,
            stream_interval=stream_interval,
        )
        reason = check() if pool is None else await asyncio.get_running_loop().run_in_executor(pool, check)
        self.record(url, rid, reason)
        if self.wants(url):
            future = asyncio.get_running_loop().create_future()
            self._held.append((url, future))
            if self.on_hold is not None:
                self.on_hold()
            await future

    def release_if_stuck(self, tasks: int) -> None:
        """`release`, where every one of a run's `tasks` left holds an answer."""
        if self.holding and self.holding >= tasks:
            self.release()

    def release(self) -> None:
        """Let every waiting answer be kept: nothing else can come to confirm or refuse its server."""
        for url in {url for url, future in self._held if not future.done()}:
            log.info("%s: all %d of its answers so far agree with model.tokenizer", url, self.agreed.get(url, 0))
        for url, future in self._held:
            self.released[url] = self.released.get(url, 0) + (not future.done())
        self._settle(None, None)

    def _settle(self, url: str | None, refusal: str | None) -> None:
        """End the waits of `url`'s answers (every server's: None): kept, or refused with `refusal`."""
        for held_url, future in self._held:
            if future.done() or url not in (None, held_url):
                continue
            if refusal is None:
                future.set_result(None)
            else:
                future.set_exception(ServerMismatch(refusal))
        self._held = [(held_url, future) for held_url, future in self._held if not future.done()]
