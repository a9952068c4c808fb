"""Streamed /generate answers and the live loop stop (docs/quality.md): a request's output read chunk by
chunk (so that a cut answer can be resumed from the ids received), and where loops are stopped live,
watched for a repetition loop and stopped on the server (`POST /abort_request`) once it ends in one.
SGLang 0.5.23 streams events `data: {json}\\n\\n`, then `data: [DONE]`; with `--incremental-streaming-output`
each chunk holds only the ids and text new since the one before (the client never streams without it).
The abort's last chunk says `completion_tokens` and repeats the last id: only the ids it adds to reach
that count are taken, so a row stopped as a loop holds exactly the tokens generated. Imports `answers`.
"""

import logging
from dataclasses import dataclass
from time import monotonic

import aiohttp
import orjson
from yarl import URL

from eagle3_datagen.generation.answers import (
    RETRYABLE_STATUS,
    FinalError,
    RetryableError,
    check_ids,
    interpret,
    parse_response,
)
from eagle3_datagen.generation.requests import Request
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.quality.loops import LiveLoopWatch, Loop, LoopSettings

log = logging.getLogger(__name__)

_EVENT_END = b"\n\n"
_DONE = b"[DONE]"


@dataclass(frozen=True)
class LiveStop:
    """How the client streams answers and stops loops while they are generated (config `quality`):
    `loop` None streams without a loop watch (loops run to their budget)."""

    loop: LoopSettings | None
    stream_interval: int

    @classmethod
    def from_quality(cls, quality) -> "LiveStop":
        """From `quality.flags.QualitySettings`: the loop watch only where loops are stopped live."""
        return cls(quality.loop if quality.stops_loops_live else None, int(quality.stream_interval))


def _events(buf: bytearray, start: int):
    """The complete events in `buf` (searched from `start`) as their data, and where the next one begins."""
    pos, out = 0, []
    while True:
        end = buf.find(_EVENT_END, max(pos, start))
        if end < 0:
            return out, pos
        data = []
        for line in bytes(buf[pos:end]).split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
        if data:
            out.append(b"\n".join(data))
        pos = end + len(_EVENT_END)


class StreamedAnswer:
    """One streamed answer being read: its ids and text so far, the loop watch, and how it ended."""

    def __init__(self, req: Request, vocab_size: int, live: LiveStop, stop_ids=()):
        self.req = req
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(stop_ids)
        self.live = live
        self.ids: list[int] = []
        self.pieces: list[str] = []
        self.watch = LiveLoopWatch(live.loop) if live.loop is not None else None
        self.stream_interval = live.stream_interval
        self.loop: Loop | None = None  # the loop found, once the abort is sent
        self.last: dict | None = None  # the chunk with a finish_reason
        self.done = False
        self.seen = 0.0  # when the last bytes came (time.monotonic): `pacing.Deadlines` reads it
        # Where each continuation began (`resume`): the ids before it came from earlier attempts.
        self.resumed_at: list[int] = []
        self._piece_start = 0

    def retry(self, resume: bool) -> Request:
        """The next attempt's request once this one was cut short: the continuation where it can and
        `resume` (config client.resume) says so, else the row's own request, read into this answer anew."""
        if resume and self.resumable():
            return self.resume()
        self.__init__(self.req, self.vocab_size, self.live, self.stop_ids)
        return self.req

    @property
    def start(self) -> int:
        """The ids received before this attempt (0 unless resumed)."""
        return self.resumed_at[-1] if self.resumed_at else 0

    def resumable(self) -> bool:
        """Whether a cut answer can go on: some ids came, ending neither the answer nor a loop the client stopped."""
        ids = self.ids
        return bool(ids) and self.loop is None and ids[-1] not in self.stop_ids and len(ids) < self.req.max_new_tokens

    def resume(self) -> Request:
        """The request that continues this cut answer: the prompt and the ids received, for the budget left."""
        if len(self.ids) > self.start:
            self.resumed_at.append(len(self.ids))
        self.last, self.done, self._piece_start = None, False, len(self.pieces)
        return self.req.continued(self.ids)

    def chunk(self, data: bytes) -> Loop | None:
        """Take one event's data; the loop, the first time the output so far ends in one."""
        if data == _DONE:
            self.done = True
            return None
        try:
            out = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RetryableError(f"malformed stream chunk: invalid JSON: {data[:200]!r}") from None
        if not isinstance(out, dict):
            raise RetryableError(f"malformed stream chunk: expected an object, got {type(out).__name__}")
        if "error" in out:
            raise _chunk_error(out["error"])
        if self.last is not None:
            raise RetryableError("malformed stream: a chunk after the last one")
        delta = out.get("output_ids")
        meta = out.get("meta_info")
        check_ids(delta, self.vocab_size)
        finish = meta.get("finish_reason") if isinstance(meta, dict) else None
        if isinstance(finish, dict):
            self.last = out
            if finish.get("type") == "abort":
                return self._aborted(out, delta, meta, finish)
        self.ids += delta
        text = out.get("text")
        if isinstance(text, str):
            self.pieces.append(text)
        if self.watch is not None and self.loop is None and self.last is None:
            return self.watch.feed(delta)
        return None

    def _aborted(self, out: dict, delta: list, meta: dict, finish: dict) -> None:
        """The abort's last chunk: only the ids it adds to reach `completion_tokens` are taken."""
        status = finish.get("status_code")
        if status is not None or self.loop is None:
            raise _abort_error(finish)
        total = meta.get("completion_tokens")  # this attempt's: a continuation counts from its start
        came = len(self.ids) - self.start
        extra = total - came if isinstance(total, int) else -1
        if not 0 <= extra <= len(delta):
            raise RetryableError(
                f"malformed stream: the abort's last chunk says {total} tokens were generated, but "
                f"{came} came before it and it holds {len(delta)}"
            )
        if extra:
            self.ids += delta[:extra]
            text = out.get("text")
            if isinstance(text, str):  # the whole text when the chunk repeats the last id, else new text
                own = "".join(self.pieces[self._piece_start :])  # the whole text is this attempt's
                whole = extra < len(delta) and text.startswith(own)
                self.pieces = [*self.pieces[: self._piece_start], text] if whole else [*self.pieces, text]
        return None

    def result(self) -> dict:
        """The answer's result fields once the stream has ended: every id received, over all its attempts."""
        if self.last is None:
            raise RetryableError(f"stream cut short after {len(self.ids)} tokens, before its last chunk")
        meta = self.last["meta_info"]
        stopped = meta["finish_reason"].get("type") == "abort"  # by the client (`_aborted`): a loop
        if stopped:  # read as an answer cut at its budget, then named for what it is
            meta = {**meta, "finish_reason": {"type": "length"}, "completion_tokens": len(self.ids)}
        result = parse_response({"output_ids": self.ids, "meta_info": meta}, self.req, self.vocab_size)
        if stopped:
            result |= {"finish_type": LOOP_FINISH, "finish_matched": ""}
        if self.resumed_at:
            # The server counted the last attempt only, and its prompt held the ids received before.
            result["completion_tokens"] = len(self.ids)
            result["cached_tokens"] = min(result["cached_tokens"], len(self.req.prompt_ids))
            result["resumed_at"] = list(self.resumed_at)
        return result

    def text_answer(self) -> bytes:
        """The last attempt's text as a non-streamed answer holds it (for `identity.answer_text`)."""
        return orjson.dumps({"text": "".join(self.pieces[self._piece_start :])})


def answer_fields(
    status: int, raw: "bytes | StreamedAnswer", req: Request, vocab_size: int
) -> tuple[dict, bytes, int | None]:
    """(result fields, the bytes for `identity.AnswerCheck`, the stream interval or None) of an answer."""
    if isinstance(raw, StreamedAnswer):
        return raw.result(), raw.text_answer(), raw.stream_interval
    return interpret(status, raw, req, vocab_size), raw, None


def _chunk_error(error) -> Exception:
    """An `{"error": ...}` chunk (a ValueError in `stream_results`, 0.5.23: code 400 unless it says)."""
    message = error.get("message", error) if isinstance(error, dict) else error
    code = error.get("code", 400) if isinstance(error, dict) else 400
    text = f"stream error {code}: {message}"
    return RetryableError(text) if code in RETRYABLE_STATUS else FinalError(text)


def _abort_error(finish: dict) -> Exception:
    """An abort the client did not ask for: final for a 4xx status_code (as that HTTP status), else retried."""
    status = finish.get("status_code")
    if status is not None and status not in RETRYABLE_STATUS and 400 <= status < 500:
        return FinalError(f"HTTP {status}: {finish.get('message')}")
    return RetryableError(f"aborted by the server: {finish.get('message')}")


async def read_stream(resp: aiohttp.ClientResponse, answer: StreamedAnswer, abort) -> StreamedAnswer:
    """Read a streamed answer to its end (each event parsed once); on a loop, `await abort()` and read on."""
    buf, start = bytearray(), 0
    async for data in resp.content.iter_any():
        answer.seen = monotonic()  # an idle timeout's whole cost per read
        buf += data
        events, consumed = _events(buf, start)
        if consumed:
            del buf[:consumed]
        start = max(0, len(buf) - 1)
        for event in events:
            if answer.done:
                break  # nothing follows [DONE]
            loop = answer.chunk(event)
            if loop is not None:
                answer.loop = loop
                await abort(loop)
    return answer


async def post_streamed(
    session: aiohttp.ClientSession, url: URL, body: bytes, answer: StreamedAnswer, rid: str
) -> tuple[int, "bytes | StreamedAnswer"]:
    """POST a streamed request: (status, the answer read to its end), or (status, body) of an HTTP error."""

    async def abort(loop: Loop) -> None:
        log.debug("%s: stopping a loop: %s", rid, loop.describe())
        try:
            async with session.post(url.parent / "abort_request", data=orjson.dumps({"rid": rid})) as resp:
                if resp.status != 200:
                    log.warning("%s: /abort_request answered HTTP %d: %s", rid, resp.status, (await resp.read())[:200])
        except aiohttp.ClientError as exc:
            log.warning("%s: /abort_request failed (%s: %s); the request runs to its end", rid, type(exc).__name__, exc)

    async with session.post(url, data=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.read()
        return resp.status, await read_stream(resp, answer, abort)
