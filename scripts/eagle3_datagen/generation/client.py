"""The generate client: one prompt per request to SGLang's native /generate (SGLang fails a whole batch on
one bad prompt, and its continuous batching gains nothing from client-side batches), many in flight.
Transient failures are retried with jittered exponential backoff (a streamed answer cut short from the
ids received); HTTP 400 is final. Every row ends `ok` (exact `output_ids`) or `failed` (the last error).
`run_loop` runs a client's coroutine. Imports this layer, `storage.disk`.
"""

import asyncio
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from eagle3_datagen.generation.answers import FinalError, RetryableError
from eagle3_datagen.generation.identity import AnswerCheck, ServerMismatch
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.generation.load import Concurrency, Load, Timeline
from eagle3_datagen.generation.pacing import Deadlines, Progress, Slots
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.server_info import LoadReader
from eagle3_datagen.generation.streaming import LiveStop, StreamedAnswer, answer_fields, post_streamed
from eagle3_datagen.settings import DEFAULT_MODE, ClientSettings
from eagle3_datagen.storage.disk import DiskFull

log = logging.getLogger(__name__)

# A new connection that takes longer than this is a server that does not answer: retried.
CONNECT_TIMEOUT_S = 30.0


def open_session(headers: dict) -> aiohttp.ClientSession:
    """The session every request of a run goes through: no connection limit (the slots bound what is in
    flight), no timer per request (`Deadlines`), no cookie jar, compression, or proxy from the environment
    (a cluster's http_proxy is for the internet, not for the job's own server)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        headers=headers,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=CONNECT_TIMEOUT_S),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


def run_loop(coro):
    """Run a coroutine of the client to its end on uvloop's event loop (where installed), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class ServerDied(RuntimeError):
    """The server this job launched is gone: no retry can succeed."""


@dataclass
class _Run:
    """The state of one `GenerateClient.run`: what is in flight, what follows, what went wrong."""

    slots: Slots
    journal: Journal | None
    keep_results: bool
    follow: Callable[[Request, dict], Request | None] | None
    results: dict = field(default_factory=dict)
    tasks: set = field(default_factory=set)
    errors: list = field(default_factory=list)
    ready: deque = field(default_factory=deque)  # follow-up requests, sent first
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    syncing: bool = False


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
        answer_check: AnswerCheck | None = None,
        live: LiveStop | None = None,
    ):
        if not urls:
            raise ValueError("no server URL to send requests to")
        self.urls = [u.rstrip("/") for u in urls]
        self._generate_urls = [URL(f"{u}/generate") for u in self.urls]  # parsed once, not per request
        self.template, self.settings, self.label = template, settings, label
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.rng = rng or random.Random()
        self.alive = alive  # for a server this job launched: whether its process still runs
        self.answer_check = answer_check
        self.live = live  # None: answers are not streamed (nor resumed), loops run to their budget
        self._pool: ThreadPoolExecutor | None = None  # the run's thread for tokenizer work
        self.run_nonce = secrets.token_hex(4)
        self._next_url = self.in_flight = 0
        self.loads = LoadReader(self.urls)
        self._deadlines = Deadlines()
        self._session: aiohttp.ClientSession | None = None
        self.timeline = Timeline()
        self.control: Concurrency | None = None
        self.progress: Progress | None = None

    def _url(self) -> tuple[str, URL]:
        """The next server, round robin: (its base URL, its /generate URL)."""
        n = self._next_url % len(self._generate_urls)
        self._next_url += 1
        return self.urls[n], self._generate_urls[n]

    def backoff(self, attempt: int) -> float:
        base = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * 2 ** (attempt - 1))
        return base * self.rng.uniform(0.5, 1.5)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = open_session(self.headers)
        return self._session

    async def close(self) -> None:
        self._deadlines.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, req: Request, attempt: int, url: URL | None = None, answer=None) -> tuple:
        """POST one attempt of `req` to `url`: (status, answer bytes or the streamed `answer` read to its end)."""
        task = asyncio.current_task()
        timeout_s = self.settings.request_timeout(req.max_new_tokens)
        self._deadlines.watch(task, timeout_s, answer, self.settings.request_timeout_floor_s)
        self.in_flight += 1
        try:
            rid, url = req.rid(self.run_nonce, attempt), url or self._url()[1]
            if answer is not None:
                body = (req.template or self.template).body(req, rid, self.live.stream_interval)
                return await post_streamed(self.session, url, body, answer, rid)
            async with self.session.post(url, data=(req.template or self.template).body(req, rid)) as resp:
                return resp.status, await resp.read()
        except asyncio.CancelledError:
            # The watchdog's cancellation alone is a timeout; any other (the job stopping) goes on.
            reason = self._deadlines.expired(task)
            if reason and task.cancelling() <= 1:
                task.uncancel()
                raise RetryableError(reason) from None
            raise
        except aiohttp.ClientError as exc:
            raise RetryableError(f"connection error: {type(exc).__name__}: {exc}") from None
        finally:
            self.in_flight -= 1
            self._deadlines.forget(task)

    async def generate_one(self, req: Request, progress: Progress | None = None, slots: Slots | None = None) -> dict:
        """Send one row until it succeeds, fails finally, or runs out of retries. With `slots`, it holds one
        and gives it back as soon as the server has answered, so the server never waits on the bookkeeping."""
        held = slots is not None
        template, sent = req.template or self.template, req
        answer = StreamedAnswer(req, template.vocab_size, self.live, template.stop_token_ids) if self.live else None

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
                    base, url = self._url()
                    try:
                        status, raw = await self._post(sent, attempt, url, answer)
                    finally:
                        release()
                    if slots is not None:
                        # Two turns of the event loop: the first wakes the dispatcher waiting for
                        # the slot (it creates the next request's task), the second runs that task
                        # up to its send. Only then is this answer parsed and journalled.
                        await asyncio.sleep(0)
                        await asyncio.sleep(0)
                    result, raw, interval = answer_fields(status, raw, req, self.template.vocab_size)
                    if self.answer_check is not None:  # what the server answered to what it was sent
                        own = result["output_ids"][len(sent.prompt_ids) - len(req.prompt_ids) :]
                        rid = req.rid(self.run_nonce, attempt)
                        await self.answer_check.vet(base, rid, raw, own, sent.prompt_ids, self._pool, interval)
                    return {**result, "status": "ok", "error": "", "attempts": attempt}
                except FinalError as exc:
                    return {"status": "failed", "error": str(exc), "attempts": attempt}
                except RetryableError as exc:
                    last_error = str(exc)
                    sent = answer.retry(self.settings.resume) if answer is not None else req
                    if self.alive is not None and not self.alive():
                        raise ServerDied(f"the server died during the run (last error: {exc})") from None
                    if attempt > self.settings.max_retries:
                        break
                    delay = self.backoff(attempt)
                    if progress is not None:
                        progress.retried(req.label, attempt, last_error, delay)
                    else:
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
        """What the last run saw of the servers' load, for the provenance and the report."""
        timeline = self.timeline.as_columns()
        limits = timeline["limit"]
        return {
            "concurrency": self.settings.concurrency,
            "max_concurrency": self.settings.cap,
            "limit_mean": round(sum(limits) / len(limits), 1) if limits else None,
            "limit_max": max(limits) if limits else None,
            "retractions": self.control.retractions if self.control else 0,
            "limit_cuts": self.control.cuts if self.control else 0,
            "load_endpoint": sorted({p for p in self.loads.paths.values() if p}),
            "timeline": timeline,
        }

    async def _follow_load(self, control: Concurrency, slots: Slots) -> None:
        """Every `load_poll_s`: read the servers' load, move the limit (auto), note the timeline."""
        started = time.monotonic()
        warned = False
        while True:
            load = await self.loads.read(self.session)
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

    async def _handle(self, run: _Run, req: Request) -> None:
        """One request to its end: sent, its result kept and journalled, and its follow-up made ready."""
        result = await self.generate_one(req, self.progress, run.slots)
        self.control.retracted(result.get("num_retractions", 0))
        if run.keep_results:
            run.results[req.key] = result
        if run.journal is not None:
            entry = {"id": req.id, "sample_index": req.sample_index, "fingerprint": req.fingerprint, **result}
            if req.turn:
                entry["turn"] = req.turn
            if req.mode != DEFAULT_MODE:
                entry["mode"] = req.mode
            run.journal.append(entry)
        # Counted as soon as it is journalled: a job stopped during the fsync below (scancel) publishes
        # as done every row its journal holds.
        self.progress.add(tokens=len(result.get("output_ids", ())), failed=result["status"] != "ok")
        if run.journal is not None and run.journal.sync_due() and not run.syncing:
            run.syncing = True  # fsync off the event loop, one at a time
            try:
                await asyncio.to_thread(run.journal.sync)
            finally:
                run.syncing = False
        if run.follow is not None:
            following = await asyncio.get_running_loop().run_in_executor(self._pool, run.follow, req, result)
            if following is not None:
                run.ready.append(following)

    async def _next_request(self, run: _Run, source) -> tuple[Request | None, object]:
        """A follow-up if one is ready, else the next new request, else (None, ...): no work is left. Waits
        without the caller's slot for follow-ups that requests in flight may still make (a retry needs one)."""
        while not run.errors:
            if run.ready:
                return run.ready.popleft(), source
            if source is not None:
                req = next(source, None)
                if req is not None:
                    return req, source
                source = None
            if not run.tasks:
                break
            run.slots.release()
            await self._wait_for_change(run)
            await run.slots.acquire()
        return None, source

    async def _wait_for_change(self, run: _Run) -> None:
        """Wait for a task to end or an answer to be held (`AnswerCheck.release_if_stuck` first)."""
        if self.answer_check is not None:
            self.answer_check.release_if_stuck(len(run.tasks))
        run.wake.clear()
        await run.wake.wait()

    async def _dispatch(self, run: _Run, requests: Iterable[Request]) -> None:
        """Start a request whenever a slot is free, until no work is left; then wait for the rest."""

        def done(task: asyncio.Task) -> None:
            run.tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                run.errors.append(task.exception())
                # Nothing in flight may be kept (a wrong server), or can be (a full disk): stop it now.
                if isinstance(task.exception(), (ServerMismatch, DiskFull)):
                    for other in run.tasks:
                        other.cancel()
            run.wake.set()

        source = iter(requests)
        while True:
            await run.slots.acquire()
            req, source = await self._next_request(run, source)
            if req is None:
                run.slots.release()
                break
            task = asyncio.create_task(self._handle(run, req))
            run.tasks.add(task)
            task.add_done_callback(done)
        while run.tasks:
            await self._wait_for_change(run)

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

        `requests` may be a lazy iterator (`total`: how many it holds, at most), drawn from as slots free up.
        `follow(request, result)` runs in a worker thread once a result is journalled and may return the
        next turn: it takes the next free slot before any new request, while its prefix is cached.
        """
        if total is None:
            requests, total = list(requests), len(requests)
        control = self.control = Concurrency(
            self.settings.cap, auto=self.settings.auto, queue_target=self.settings.queue_target
        )
        progress = self.progress = Progress(total, self.settings.progress_interval_s, self.label)
        run = _Run(Slots(control.limit), journal, keep_results, follow)
        if follow or self.answer_check:  # the follow-ups' thread checks answers too: one tokenizer user at a time
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="follow")
        if self.answer_check is not None:
            self.answer_check.on_hold = run.wake.set
        self.timeline = Timeline()
        if control.auto:
            progress.note = lambda: f" | concurrency {run.slots.limit} (auto), {control.retractions} retractions"
        poller = asyncio.create_task(self._follow_load(control, run.slots))
        try:
            await self._dispatch(run, requests)
        finally:
            poller.cancel()
            for task in list(run.tasks):
                task.cancel()
            await asyncio.gather(poller, *run.tasks, return_exceptions=True)
            await self.close()
            if journal is not None:
                journal.sync()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        if run.errors:
            raise run.errors[0]
        if total:
            progress.log()
        rps, tps = progress.rates()
        self.pace = {  # what the run measured, for the provenance
            "run_nonce": self.run_nonce,
            "requests_per_s": round(rps, 3),
            "tokens_per_s": round(tps, 1),
            "requests": progress.done,
            "output_tokens": progress.tokens,
            "elapsed_s": round(time.monotonic() - progress.started, 3),
        }
        return run.results
