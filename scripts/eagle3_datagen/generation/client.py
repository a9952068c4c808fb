"""The generate client: one prompt per request to SGLang's native /generate, many in flight.

Why one prompt per request: SGLang fails a whole batch on one bad prompt, and continuous batching on
the server side gains nothing from client-side batches. A bounded number of requests stays in flight
(enough to keep the server's batch full); transient failures (HTTP 5xx, 429, connection resets,
timeouts, aborted or malformed answers) are retried with jittered exponential backoff; HTTP 400 is
final. Every row ends as `ok` (exact `output_ids` as returned) or `failed` (with the last error).
"""

import asyncio
import hashlib
import json
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import aiohttp
import orjson

from eagle3_datagen.generation import http
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.load import Concurrency, Load, Timeline, parse_loads
from eagle3_datagen.settings import ClientSettings, canonical_json

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
LOAD_TIMEOUT_S = 5.0


class FinalError(Exception):
    """A request error that retrying cannot fix (HTTP 400 and the like)."""


class RetryableError(Exception):
    """A transient request error: the row is sent again after a backoff."""


class ServerDied(RuntimeError):
    """The server this job launched is gone: no retry can succeed."""


@dataclass
class Request:
    """What the client sends for one (id, sample_index, turn) row."""

    id: str
    sample_index: int
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int
    fingerprint: str = ""
    turn: int = 0

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.id, self.sample_index, self.turn)

    @property
    def label(self) -> str:
        return f"{self.id}.{self.sample_index}" + (f".t{self.turn}" if self.turn else "")


def parse_rid(rid: str) -> tuple[tuple[str, int, int], str, int]:
    """((id, sample_index, turn), run nonce, attempt) of a rid the client made:
    `{id}.{sample}[.t{turn}].{nonce}.{attempt}` (ids may hold dots; the turn is there from turn 1)."""
    head, nonce, attempt = rid.rsplit(".", 2)
    head, last = head.rsplit(".", 1)
    turn = 0
    if last.startswith("t") and last[1:].isdigit() and head.rsplit(".", 1)[-1].isdigit() and "." in head:
        turn = int(last[1:])
        head, last = head.rsplit(".", 1)
    return (head, int(last), turn), nonce, int(attempt)


@dataclass
class RequestTemplate:
    """The parts of every request body that do not vary by row."""

    sampling: dict
    stop_token_ids: list[int]
    vocab_size: int
    model_fingerprint: dict = field(default_factory=dict)
    _model_json: bytes | None = field(default=None, repr=False, compare=False)
    _orjson_agrees: bool | None = field(default=None, repr=False, compare=False)

    def sampling_params(self, req: Request) -> dict:
        # Every value explicit: /generate applies none of the model's generation_config defaults.
        return {
            **self.sampling,
            "max_new_tokens": req.max_new_tokens,
            "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "sampling_seed": req.seed,
        }

    def _sampling_json(self, params: dict) -> bytes:
        """`canonical_json(params)`, by orjson where it writes the same bytes: checked on the first
        request, since only integers (budget, seed) differ from one request to the next, and orjson
        writes integers as the standard library does (it differs on some floats, e.g. 1e-05)."""
        try:
            fast = orjson.dumps(params, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # an integer beyond 64 bits
            return canonical_json(params)
        if self._orjson_agrees is None:
            self._orjson_agrees = fast == canonical_json(params)
        return fast if self._orjson_agrees else canonical_json(params)

    def fingerprint(self, req: Request) -> str:
        """Identity of the request's result: the same fingerprint always means the same generation.

        `stable_hash([model_fingerprint, prompt_ids, sampling_params, sample_index])`, byte for byte,
        with the prompt ids (the bulk) written by orjson: a list of integers comes out the same as
        from the standard library's canonical form, and the rest is small."""
        if self._model_json is None:
            self._model_json = canonical_json(self.model_fingerprint)
        digest = hashlib.sha256(b"[")
        digest.update(self._model_json)
        digest.update(b",")
        digest.update(orjson.dumps(req.prompt_ids))
        digest.update(b",")
        digest.update(self._sampling_json(self.sampling_params(req)))
        digest.update(b"," + str(int(req.sample_index)).encode() + b"]")
        return digest.hexdigest()


def error_text(status: int, body: str) -> str:
    """SGLang's error shapes as one line: {"error": {"message"}}, {"error": "..."}, {"detail": ...}, and
    the OpenAI-style {"object": "error", "message", "type", "param", "code"} of 0.5.23's validation errors,
    invalid JSON bodies and aborts."""
    try:
        data = json.loads(body)
    except ValueError:
        return f"HTTP {status}: {body[:500]}"
    message = data
    if isinstance(data, dict):
        if isinstance(data.get("error"), dict):
            message = data["error"].get("message", data["error"])
        elif "error" in data:
            message = data["error"]
        elif "detail" in data:
            message = data["detail"]
        elif "message" in data:
            message = data["message"]
    return f"HTTP {status}: {message}"


# The answer's output ids as SGLang serializes them (orjson: no spaces). Inside a JSON string every
# quote is escaped, so this key can only be the top-level one, never a piece of `text`.
_IDS_KEY = b'"output_ids":['
_PLAIN_IDS = b"0123456789,"


def ids_are_plain(raw: bytes | None, n: int) -> bool | None:
    """Whether the answer's `output_ids` are written as non-negative integers only (digits and commas:
    no sign, fraction, exponent, string, boolean or null), read from the answer's bytes in one pass of
    C code instead of a type check per id; None when `raw` does not hold the ids in SGLang's compact
    form (then the ids are checked one by one)."""
    if raw is None:
        return None
    start = raw.find(_IDS_KEY)
    if start < 0:
        return None
    start += len(_IDS_KEY)
    end = raw.find(b"]", start)
    if end < 0:
        return None
    region = raw[start:end]
    if region.count(b",") != max(n - 1, 0):
        return None  # not the list orjson parsed (a nested or repeated key): check one by one
    return not region.translate(None, _PLAIN_IDS)


def parse_response(data, req: Request, vocab_size: int, raw: bytes | None = None) -> dict:
    """Validate one /generate answer and turn it into result fields; a bad answer is retryable.

    `raw`, the answer's bytes, lets the ids be checked without Python work per id (`ids_are_plain`)."""
    if not isinstance(data, dict):
        raise RetryableError(f"malformed response: expected an object, got {type(data).__name__}")
    output_ids = data.get("output_ids")
    meta = data.get("meta_info")
    if not isinstance(output_ids, list):
        raise RetryableError("malformed response: 'output_ids' missing or not a list of integers")
    plain = ids_are_plain(raw, len(output_ids))
    if plain is None:  # not SGLang's compact bytes: one check per id
        plain = set(map(type, output_ids)) <= {int} and (not output_ids or min(output_ids) >= 0)
    if not plain:
        if not all(type(t) is int for t in output_ids):
            raise RetryableError("malformed response: 'output_ids' missing or not a list of integers")
        bad = [t for t in output_ids if t < 0]
        raise RetryableError(f"malformed response: output ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
    if not isinstance(meta, dict) or not isinstance(meta.get("finish_reason"), dict):
        raise RetryableError("malformed response: 'meta_info.finish_reason' missing")
    finish = meta["finish_reason"]
    finish_type = finish.get("type")
    if finish_type == "abort":
        raise RetryableError(f"aborted by the server: {finish.get('message')}")
    if finish_type not in ("stop", "length"):
        raise RetryableError(f"malformed response: unknown finish_reason type {finish_type!r}")
    if not output_ids:
        raise RetryableError("malformed response: no output tokens")
    if max(output_ids) >= vocab_size:
        bad = [t for t in output_ids if not 0 <= t < vocab_size]
        raise RetryableError(f"malformed response: output ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
    if len(output_ids) > req.max_new_tokens:
        raise RetryableError(
            f"malformed response: {len(output_ids)} output tokens, more than max_new_tokens {req.max_new_tokens}"
        )
    matched = finish.get("matched")
    return {
        "output_ids": output_ids,
        "finish_type": finish_type,
        "finish_matched": "" if matched is None else str(matched),
        "completion_tokens": int(meta.get("completion_tokens", len(output_ids))),
        "cached_tokens": int(meta.get("cached_tokens", 0) or 0),
        "e2e_latency": float(meta.get("e2e_latency", 0.0) or 0.0),
        # Load facts (SGLang 0.5.23 tokenizer_manager._handle_batch_output): how often the scheduler
        # retracted the request to free KV cache, and (with --enable-metrics) its seconds queued.
        "num_retractions": int(meta.get("num_retractions", 0) or 0),
        "queue_time": float(meta.get("queue_time", 0.0) or 0.0),
    }


class Progress:
    """A periodic progress line: done/total, requests/s, tokens/s, ETA."""

    def __init__(self, total: int, interval_s: float, label: str):
        self.total, self.interval_s, self.label = total, interval_s, label
        self.done = self.failed = self.retries = self.tokens = 0
        self.started = self._last = time.monotonic()
        self.note: Callable[[], str] | None = None  # more to say on each line

    def add(self, *, tokens: int = 0, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        self.tokens += tokens
        now = time.monotonic()
        if now - self._last >= self.interval_s or self.done == self.total:
            self._last = now
            self.log()

    def rates(self) -> tuple[float, float]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return self.done / elapsed, self.tokens / elapsed

    def log(self) -> None:
        rps, tps = self.rates()
        remaining = self.total - self.done
        eta = remaining / rps if rps > 0 else float("inf")
        log.info(
            "%s: %d/%d rows (%d failed, %d retries) | %.2f req/s | %.0f tok/s | ETA %s%s",
            self.label,
            self.done,
            self.total,
            self.failed,
            self.retries,
            rps,
            tps,
            "-" if eta == float("inf") else f"{eta:.0f} s",
            self.note() if self.note else "",
        )


class Slots:
    """A semaphore whose size may change while it is in use: at most `limit` holders.

    A lower limit takes effect as slots are given back (no request in flight is cut short); a
    higher one wakes waiters at once. A slot is handed straight to the first waiter, as
    asyncio.Semaphore does, so a freed slot costs no extra turn of the event loop."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._waiters: deque[asyncio.Future] = deque()

    def set_limit(self, limit: int) -> None:
        self.limit = limit
        self._wake()

    async def acquire(self) -> None:
        if self.held < self.limit and not self._waiters:
            self.held += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut  # the slot is counted as held when the future is resolved
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot, then cancelled before taking it
            elif fut in self._waiters:
                self._waiters.remove(fut)
            raise

    def release(self) -> None:
        self.held -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.held < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.held += 1
                fut.set_result(None)


class Deadlines:
    """Request timeouts kept by one watchdog task instead of a timer per request (a timer per
    request, as aiohttp arms, costs more on uvloop than the rest of a request's bookkeeping). A
    request past its deadline has its task cancelled, as asyncio's and aiohttp's timeouts do, and
    `expired` then tells that cancellation from any other; the watchdog wakes every `TICK_SHARE` of
    the shortest timeout being kept (at most once a second)."""

    TICK_SHARE = 0.05

    def __init__(self):
        self._deadlines: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
        self._tick = 1.0
        self._watchdog: asyncio.Task | None = None

    def watch(self, task: asyncio.Task, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._deadlines[task] = loop.time() + timeout_s
        self._tick = min(self._tick, max(timeout_s * self.TICK_SHARE, 0.001))
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())

    def forget(self, task: asyncio.Task) -> None:
        self._deadlines.pop(task, None)
        self._expired.discard(task)

    def expired(self, task: asyncio.Task) -> bool:
        return task in self._expired

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._deadlines:
            await asyncio.sleep(self._tick)
            now = loop.time()
            for task, deadline in list(self._deadlines.items()):
                if now >= deadline and task not in self._expired:
                    self._expired.add(task)
                    task.cancel()

    def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()


class GenerateClient:
    def __init__(
        self,
        urls: list[str],
        template: RequestTemplate,
        settings: ClientSettings,
        *,
        headers: dict | None = None,
        label: str = "generate",
        rng: random.Random | None = None,
        alive=None,
    ):
        if not urls:
            raise ValueError("no server URL to send requests to")
        self.urls = [u.rstrip("/") for u in urls]
        self.template = template
        self.settings = settings
        # Every request's headers: bodies are JSON (orjson bytes), and the API key where one is set.
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.label = label
        self.rng = rng or random.Random()
        # For a server this job launched: a callable telling whether its process still runs.
        self.alive = alive
        self.run_nonce = secrets.token_hex(4)
        self._next_url = 0
        self.in_flight = 0
        self._load_paths: dict[str, str | None] = {}  # the load endpoint each server answers, None: none
        self._deadlines = Deadlines()
        self._servers: dict[str, http.Server] = {}  # keep-alive connections for /generate, per server
        self.timeline = Timeline()
        self.control: Concurrency | None = None

    def _url(self) -> str:
        url = self.urls[self._next_url % len(self.urls)]
        self._next_url += 1
        return url

    def backoff(self, attempt: int) -> float:
        base = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * 2 ** (attempt - 1))
        return base * self.rng.uniform(0.5, 1.5)

    def _server(self, url: str) -> http.Server:
        server = self._servers.get(url)
        if server is None:
            server = self._servers[url] = http.Server(url, headers=self.headers)
        return server

    async def _post(self, req: Request, attempt: int) -> tuple[int, bytes]:
        body = {
            "input_ids": req.prompt_ids,
            "sampling_params": self.template.sampling_params(req),
            # Unique per attempt and per run: SGLang rejects a rid that is still in flight, and an
            # attempt from before a restart may still run on an external server.
            "rid": f"{req.label}.{self.run_nonce}.{attempt}",
        }
        timeout_s = self.settings.request_timeout(req.max_new_tokens)
        task = asyncio.current_task()
        self._deadlines.watch(task, timeout_s)
        self.in_flight += 1
        try:
            return await self._server(self._url()).post("/generate", orjson.dumps(body))
        except asyncio.CancelledError:
            # The watchdog's cancellation alone is a timeout; any other (the job stopping) goes on.
            if self._deadlines.expired(task) and task.cancelling() <= 1:
                task.uncancel()
                raise RetryableError(f"timed out after {timeout_s:.0f} s") from None
            raise
        except http.HTTPError as exc:
            raise RetryableError(f"connection error: {exc}") from None
        finally:
            self.in_flight -= 1
            self._deadlines.forget(task)

    def _interpret(self, status: int, raw: bytes, req: Request) -> dict:
        if status != 200:
            message = error_text(status, raw.decode("utf-8", errors="replace"))
            if status in RETRYABLE_STATUS:
                raise RetryableError(message)
            raise FinalError(message)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RetryableError(f"malformed response: invalid JSON: {raw[:200]!r}") from None
        return parse_response(data, req, self.template.vocab_size, raw)

    async def generate_one(
        self,
        req: Request,
        progress: Progress | None = None,
        slots: "Slots | None" = None,
    ) -> dict:
        """Send one row until it succeeds, fails finally, or runs out of retries.

        With `slots`, it is called holding one slot and gives it back the moment the server has
        answered, before parsing and journalling, so the next request is already on its way: the
        server never waits on this client's bookkeeping. A retry waits out its backoff without a slot.
        """
        held = slots is not None

        def release() -> None:
            nonlocal held
            if held:
                slots.release()
                held = False

        last_error = ""
        try:
            for attempt in range(1, self.settings.max_retries + 2):
                if slots is not None and not held:
                    await slots.acquire()
                    held = True
                try:
                    try:
                        status, raw = await self._post(req, attempt)
                    finally:
                        release()
                    if slots is not None:
                        # Two turns of the event loop: the first wakes the dispatcher waiting for
                        # the slot (it creates the next request's task), the second runs that task
                        # up to its send. Only then is this answer parsed and journalled.
                        await asyncio.sleep(0)
                        await asyncio.sleep(0)
                    result = self._interpret(status, raw, req)
                    return {**result, "status": "ok", "error": "", "attempts": attempt}
                except FinalError as exc:
                    return {"status": "failed", "error": str(exc), "attempts": attempt}
                except RetryableError as exc:
                    last_error = str(exc)
                    if self.alive is not None and not self.alive():
                        raise ServerDied(f"the server died during the run (last error: {exc})") from None
                    if attempt > self.settings.max_retries:
                        break
                    if progress is not None:
                        progress.retries += 1
                    delay = self.backoff(attempt)
                    log.debug("%s attempt %d: %s; retrying in %.1f s", req.label, attempt, exc, delay)
                    await asyncio.sleep(delay)
        finally:
            release()
        return {
            "status": "failed",
            "error": f"gave up after {self.settings.max_retries + 1} attempts: {last_error}",
            "attempts": self.settings.max_retries + 1,
        }

    def load_facts(self) -> dict:
        """What the last run saw of the servers' load, for the provenance and the report: the
        concurrency setting, the limits it ran at, the retractions, and the timeline."""
        limits = self.timeline.as_columns()["limit"]
        return {
            "concurrency": self.settings.concurrency,
            "max_concurrency": self.settings.cap,
            "limit_mean": round(sum(limits) / len(limits), 1) if limits else None,
            "limit_max": max(limits) if limits else None,
            "retractions": self.control.retractions if self.control else 0,
            "limit_cuts": self.control.cuts if self.control else 0,
            "load_endpoint": sorted({p for p in self._load_paths.values() if p}),
            "timeline": self.timeline.as_columns(),
        }

    async def read_load(self, session: aiohttp.ClientSession) -> Load | None:
        """The servers' load, summed over them: `/v1/loads`, else the older `/get_load` (the first
        that answers is kept per server); None when a server has neither or does not answer."""
        total = None
        for url in self.urls:
            paths = [self._load_paths[url]] if url in self._load_paths else ["/v1/loads", "/get_load"]
            load = None
            for path in paths:
                try:
                    async with session.get(
                        f"{url}{path}", headers=self.headers, timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)
                    ) as resp:
                        if resp.status != 200:
                            continue
                        load = parse_loads(orjson.loads(await resp.read()))
                        self._load_paths[url] = path
                        break
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.debug("%s%s: %s", url, path, exc)
            if load is None:
                if url not in self._load_paths:
                    self._load_paths[url] = None  # neither endpoint: stop asking
                return None
            total = load if total is None else total + load
        return total

    async def _follow_load(self, session: aiohttp.ClientSession, control: Concurrency, slots: Slots) -> None:
        """Every `load_poll_s`: read the servers' load, move the limit (auto), note the timeline.

        Without a load endpoint, auto reads the load as a server running all it is sent with
        nothing waiting: it grows up to the cap, and stops growing at retractions."""
        started = time.monotonic()
        warned = False
        while True:
            load = None
            if any(self._load_paths.get(url, "") is not None for url in self.urls):
                load = await self.read_load(session)
            if load is None and control.auto and not warned:
                warned = True
                log.warning(
                    "%s: no load endpoint (/v1/loads, /get_load) answers; concurrency auto follows only "
                    "retractions, up to max_concurrency %d",
                    self.label,
                    control.cap,
                )
            seen = load if load is not None else Load(running=slots.held, waiting=0)
            limit = control.observe(seen, slots.held)
            if limit != slots.limit:
                log.debug("%s: concurrency %d -> %d (%s)", self.label, slots.limit, limit, seen)
                slots.set_limit(limit)
            self.timeline.add(time.monotonic() - started, self.in_flight, slots.limit, load)
            await asyncio.sleep(self.settings.load_poll_s)

    async def run(
        self,
        requests: Iterable[Request],
        journal: Journal | None = None,
        *,
        total: int | None = None,
        keep_results: bool = True,
        follow: Callable[[Request, dict], Request | None] | None = None,
    ) -> dict[tuple[str, int, int], dict]:
        """Generate every request, `concurrency` in flight; results (ok or failed) are journalled as they finish.

        `requests` may be a lazy iterator (`total` then says how many it holds, or at most): it is
        drawn from only as slots free up, so only the requests in flight are in memory. With
        `keep_results=False` the results are only journalled, and an empty dict is returned.

        `follow(request, result)`, when given, runs (in a worker thread) once a result is journalled
        and may return the request that follows it (a conversation's next turn): that request takes
        the next free slot, before any new one from `requests`, so a conversation goes on while
        its shared prefix is fresh in the server's cache, and the slots stay full while there is work.
        """
        results: dict[tuple[str, int, int], dict] = {}
        if total is None:
            requests = list(requests)
            total = len(requests)
        progress = Progress(total, self.settings.progress_interval_s, self.label)
        control = self.control = Concurrency(
            self.settings.cap, auto=self.settings.auto, queue_target=self.settings.queue_target
        )
        slots = Slots(control.limit)
        self.timeline = Timeline()
        if control.auto:
            progress.note = lambda: f" | concurrency {slots.limit} (auto), {control.retractions} retractions"
        # aiohttp only reads the servers' load: /generate goes through `http.Server`.
        connector = aiohttp.TCPConnector(limit=2 * len(self.urls))
        errors: list[BaseException] = []
        syncing = False
        ready: deque[Request] = deque()  # follow-up requests, sent first
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="follow") if follow is not None else None

        async def handle(req):
            nonlocal syncing
            result = await self.generate_one(req, progress, slots)
            control.retracted(result.get("num_retractions", 0))
            if keep_results:
                results[req.key] = result
            if journal is not None:
                entry = {"id": req.id, "sample_index": req.sample_index, "fingerprint": req.fingerprint, **result}
                if req.turn:
                    entry["turn"] = req.turn
                journal.append(entry)
                if journal.sync_due() and not syncing:
                    syncing = True  # fsync off the event loop, one at a time
                    try:
                        await asyncio.to_thread(journal.sync)
                    finally:
                        syncing = False
            progress.add(tokens=len(result.get("output_ids", ())), failed=result["status"] != "ok")
            if follow is not None:
                following = await loop.run_in_executor(pool, follow, req, result)
                if following is not None:
                    ready.append(following)

        def done(task: asyncio.Task) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                errors.append(task.exception())
            wake.set()

        async def next_request(source) -> tuple[Request | None, object]:
            """A follow-up if one is ready, else the next new request; waits for follow-ups that
            requests in flight may still make. (None, ...) when no work is left."""
            while not errors:
                if ready:
                    return ready.popleft(), source
                if source is not None:
                    req = next(source, None)
                    if req is not None:
                        return req, source
                    source = None
                if not tasks:
                    break
                wake.clear()
                await wake.wait()
            return None, source

        tasks: set[asyncio.Task] = set()
        source = iter(requests)
        async with aiohttp.ClientSession(connector=connector) as session:
            poller = asyncio.create_task(self._follow_load(session, control, slots))
            try:
                while True:
                    await slots.acquire()
                    req, source = await next_request(source)
                    if req is None:
                        slots.release()
                        break
                    task = asyncio.create_task(handle(req))
                    tasks.add(task)
                    task.add_done_callback(done)
                while tasks:
                    await asyncio.wait(set(tasks))
            finally:
                poller.cancel()
                self._deadlines.close()
                for server in self._servers.values():
                    server.close()
                for task in list(tasks):
                    task.cancel()
                await asyncio.gather(poller, return_exceptions=True)
                if journal is not None:
                    journal.sync()
                if pool is not None:
                    pool.shutdown(wait=True)
        if errors:
            raise errors[0]
        if total:
            progress.log()
        self.requests_per_s, self.tokens_per_s = progress.rates()
        self.requests_done, self.tokens_done = progress.done, progress.tokens
        self.elapsed_s = time.monotonic() - progress.started
        return results


def run_loop(coro):
    """Run a coroutine of the client to its end: on uvloop's event loop (libuv, written in C: the
    event loop's own work per request is a fraction of asyncio's), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def fetch_json(url: str, *, headers: dict | None = None, timeout_s: float = 30.0) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise HTTPStatusError(resp.status, f"GET {url}: {error_text(resp.status, text)}")
            return json.loads(text)


class HTTPStatusError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def fetch_info(base_url: str, name: str, *, headers: dict | None = None) -> dict:
    """`/server_info` or `/model_info` as 0.5.23 names them, else the older `/get_...` form (404 first).

    0.5.23 still serves the `get_` forms but logs a deprecation warning for each call.
    """
    try:
        return await fetch_json(f"{base_url}/{name}", headers=headers)
    except HTTPStatusError as exc:
        if exc.status != 404:
            raise
        return await fetch_json(f"{base_url}/get_{name}", headers=headers)


# SGLang's scheduler admits prompts shorter than max_req_input_len = min(context, KV pool) - 1 - 5
# (tp_worker.py, 0.5.23): the context a server really serves is that plus 6.
MAX_REQ_INPUT_MARGIN = 6


def served_context(info: dict) -> int | None:
    """The context the server serves: its --context-length (null when it was not given) and, where
    reported, the smaller limit its KV pool sets (max_req_input_len); None when it reports neither."""
    limits = []
    if info.get("context_length") is not None:
        limits.append(int(info["context_length"]))
    if info.get("max_req_input_len") is not None:
        limits.append(int(info["max_req_input_len"]) + MAX_REQ_INPUT_MARGIN)
    return min(limits) if limits else None


def check_server_info(info: dict, *, context_length: int, url: str) -> list[str]:
    """Start-up checks of /server_info against the config. Raises on what would corrupt data."""
    warnings = []
    if info.get("allow_auto_truncate"):
        raise RuntimeError(f"{url} runs with --allow-auto-truncate: it would silently cut prompts; refusing to use it")
    server_context = served_context(info)
    if server_context is None:
        raise RuntimeError(
            f"{url} reports neither context_length nor max_req_input_len, so the prompts sized for "
            f"model.context_length {context_length} cannot be checked against it; start it with --context-length"
        )
    if server_context < context_length:
        raise RuntimeError(
            f"{url} serves a context of {server_context} tokens, but model.context_length is {context_length}: "
            "requests sized for the config would be rejected"
        )
    for flag in ("reasoning_parser", "tool_call_parser"):
        if info.get(flag):
            warnings.append(
                f"{url} runs with --{flag.replace('_', '-')} {info[flag]}: it only affects the OpenAI chat "
                "layer, not /generate, but a server for this pipeline needs none"
            )
    if info.get("skip_tokenizer_init"):
        warnings.append(f"{url} runs with --skip-tokenizer-init: responses will carry no text (ids are unaffected)")
    return warnings
