"""An aiohttp app that answers SGLang 0.5.23's native HTTP API from a local backend.

Routes: `POST|PUT /generate`, `GET /health`, `GET /health_generate`, `GET /get_server_info`,
`GET /server_info`, `GET /get_model_info`, `GET /model_info`, `POST /abort_request`,
`GET|POST /flush_cache`, `GET /v1/loads`, and `GET /get_load` when acting as a version before
0.5.23 (0.5.23's http_server.py has no such route: 404 there). Answers and error bodies follow
`protocol` and `loads`; see their docstrings for the SGLang source each one mirrors.

With a backend that carries a `capacity.KVScheduler` the loads are the scheduler's, and answers
report its `num_retractions` and `cached_tokens`; otherwise loads count the requests in flight.
`enable_metrics` adds what SGLang's `--enable-metrics` adds to `meta_info` (`queue_time` and the
time stamps of `protocol.metrics_meta_info`).

Every request served is appended to `record_path` as one JSON line when it ends: one line per
single request of a body that ran, one line per body refused or failed as a whole. Keys: `rid`,
`input_ids`, `sampling_params` (as received), `output_ids`, `finish_reason`, `status` (HTTP status;
499 when the client went away first, null for an injected reset or hang), `t_start`, `t_end`,
`error`, `fault`.

`Faults` injects latency and failures for tests; every draw comes from one seeded RNG.
"""

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from eagle3_datagen.engine import loads, protocol
from eagle3_datagen.engine.backends import RUNNING, WAITING, Backend, Job
from eagle3_datagen.engine.protocol import RequestError

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.2


@dataclasses.dataclass
class Faults:
    """Injected misbehaviour of `/generate`, drawn per HTTP request from `random.Random(seed)`.

    latency_ms: (lo, hi) added before the request runs (it is already in flight then).
    error_rate: probability of an HTTP 500 or 503 (even odds) with a `{"detail": ...}` body.
    reset_rate: probability of closing the connection without an answer.
    hang_rate: probability of never answering until the client goes away.
    fail_rids: a regex; a body with a rid it matches (re.search) always gets HTTP 500.
    """

    latency_ms: tuple[float, float] | None = None
    error_rate: float = 0.0
    reset_rate: float = 0.0
    hang_rate: float = 0.0
    fail_rids: str | None = None
    seed: int = 0

    def __post_init__(self):
        total = self.error_rate + self.reset_rate + self.hang_rate
        if not 0.0 <= total <= 1.0:
            raise ValueError(f"fault rates must add up to at most 1, got {total}")
        self._rng = random.Random(self.seed)
        self._fail = re.compile(self.fail_rids) if self.fail_rids else None

    def draw(self, rids: list[str]) -> tuple[str | None, int | None, float]:
        """(fault kind or None, HTTP status for "error", latency in seconds) for one request."""
        if self._fail is not None:
            for rid in rids:
                if self._fail.search(rid):
                    return "fail_rid", 500, 0.0
        u = self._rng.random()
        kind, status = None, None
        if u < self.reset_rate:
            kind = "reset"
        elif u < self.reset_rate + self.hang_rate:
            kind = "hang"
        elif u < self.reset_rate + self.hang_rate + self.error_rate:
            kind, status = "error", self._rng.choice((500, 503))
        delay = 0.0
        if self.latency_ms:
            lo, hi = self.latency_ms
            delay = self._rng.uniform(lo, hi) / 1000.0
        return kind, status, delay


class Recorder:
    """Append-only JSON lines, flushed per line."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        self._fh = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, **row: Any) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, ensure_ascii=False), status=status, content_type="application/json")


async def _read_json(request: web.Request) -> Any:
    """`request.json()`, parsed by orjson where the body is UTF-8; anything orjson refuses is parsed
    again by `json.loads`, so that results and errors stay exactly those of `request.json()`."""
    raw = await request.read()
    charset = request.charset
    if charset is None or charset.lower() in ("utf-8", "utf8"):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw.decode(charset or "utf-8"))


def _disconnected(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class EngineServer:
    """State behind the routes: the backend, requests in flight, the record, the faults."""

    def __init__(
        self,
        backend: Backend,
        *,
        context_length: int,
        model_path: str,
        tokenizer_path: str,
        record_path: Path | None,
        version: str,
        faults: Faults | None,
        enable_metrics: bool = False,
    ):
        self.backend = backend
        self.scheduler = getattr(backend, "scheduler", None)
        self.enable_metrics = enable_metrics
        self.legacy = _version_tuple(version) < (0, 5, 23)
        self.context_length = context_length
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.version = version
        self.faults = faults or Faults()
        self.recorder = Recorder(record_path)
        self.inflight: dict[str, Job] = {}
        self.startup_time = time.time()
        self.load_error: BaseException | None = None
        self._start_task: asyncio.Task | None = None
        self._background: set = set()
        # Test modes of the CLI: a server that never becomes healthy, one that dies mid-run.
        self.never_healthy = False
        self.die_after: int | None = None
        self.served = 0

    # -- lifecycle
    async def on_startup(self, app: web.Application) -> None:
        loop = asyncio.get_running_loop()

        async def start():
            try:
                await loop.run_in_executor(None, self.backend.start)
                log.info("backend %s ready", self.backend.name)
            except BaseException as e:  # reported through /health and app["load_error"]
                self.load_error = e
                log.exception("backend failed to start")

        self._start_task = asyncio.create_task(start())

    async def on_cleanup(self, app: web.Application) -> None:
        for job in list(self.inflight.values()):
            job.request_abort()
        if self._start_task is not None:
            await asyncio.gather(self._start_task, return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.backend.close)
        self.recorder.close()

    @property
    def ready(self) -> bool:
        worker = getattr(self.backend, "_thread", None)
        return self.backend.ready.is_set() and self.load_error is None and worker is not None and worker.is_alive()

    # -- record
    def _record_body(self, body: Any, status: int | None, t_start: float, *, error=None,
                     fault=None) -> None:  # fmt: skip
        body = body if isinstance(body, dict) else {}
        self.recorder.write(
            rid=body.get("rid"),
            input_ids=body.get("input_ids"),
            sampling_params=body.get("sampling_params"),
            output_ids=None,
            finish_reason=None,
            status=status,
            t_start=t_start,
            t_end=time.time(),
            error=error,
            fault=fault,
        )

    def _record_job(self, job: Job, status: int, t_start: float) -> None:
        self._record_answer(job.item, job.output_ids, job.finish_reason, status, t_start)

    def _record_answer(self, item, output_ids, finish_reason, status: int, t_start: float) -> None:
        self.recorder.write(
            rid=item.rid,
            input_ids=item.input_ids,
            sampling_params=item.sampling_params,
            output_ids=list(output_ids),
            finish_reason=finish_reason,
            status=status,
            t_start=t_start,
            t_end=time.time(),
            error=None,
            fault=None,
        )
        if status == 200:
            self.served += 1
            if self.die_after is not None and self.served >= self.die_after:
                log.error("dying on purpose after %d requests (--die-after)", self.served)
                self.recorder.close()
                os._exit(5)

    # -- /generate
    def _tokenize(self, text: str) -> list[int]:
        return list(self.backend.tokenizer.encode(text))

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t_start = time.time()
        try:
            body = await _read_json(request)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            err = {
                "object": "error",
                "message": f"JSON decode error: {e}",
                "type": "Bad Request",
                "param": None,
                "code": 400,
            }
            self._record_body(None, 400, t_start, error=err["message"])
            return _json(err, 400)
        if not self.ready:
            detail = "The server is not ready yet."
            self._record_body(body, 503, t_start, error=detail)
            return _json({"detail": detail}, 503)
        try:
            parsed = protocol.parse_generate_body(body, tokenize=self._tokenize)
            for item in parsed.items:  # tokenizer_manager._init_req_state
                if item.rid in self.inflight:
                    raise protocol.value_error(f"Duplicate request ID detected: {item.rid}")
            for item in parsed.items:
                protocol.validate_item(item, context_len=self.context_length, vocab_size=self.backend.vocab_size)
        except RequestError as e:
            log.info("400 for rid=%s: %s", body.get("rid") if isinstance(body, dict) else None,
                     e.message)  # fmt: skip
            self._record_body(body, e.status, t_start, error=e.message)
            return _json(e.body, e.status)

        drawn = None
        if self.backend.canned and not parsed.stream and self._canned_direct:
            drawn = self.faults.draw([item.rid for item in parsed.items])
            if drawn[0] is None and drawn[2] <= 0:
                return self._answer_canned(parsed, t_start)

        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = []
        jobs: list[Job] = []
        for item in parsed.items:
            fut = loop.create_future()

            def on_done(job: Job, fut=fut) -> None:
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(job))

            job = Job(item, max_new_tokens=self._max_new_tokens(item), on_done=on_done)
            if self.backend.canned:
                job.canned = self.backend.canned_answer(item, job.max_new_tokens)
            jobs.append(job)
            futures.append(fut)
            self.inflight[item.rid] = job
        try:
            return await self._serve(request, body, parsed, jobs, futures, t_start, drawn)
        except asyncio.CancelledError:
            # The client went away and aiohttp cancelled the handler: abort, and record once
            # the backend has stopped working on the jobs.
            for job in jobs:
                job.request_abort()
            task = asyncio.ensure_future(self._record_when_done(jobs, futures, 499, t_start))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
        finally:
            for job in jobs:
                if self.inflight.get(job.rid) is job:
                    del self.inflight[job.rid]

    def _max_new_tokens(self, item) -> int:
        """`scheduler.init_req_max_new_tokens`: the request's budget clamped to what the context (and
        the scheduler's KV pool) allows."""
        n = protocol.effective_max_new_tokens(len(item.input_ids), item.params.max_new_tokens, self.context_length)
        if self.scheduler is not None:
            n = self.scheduler.clip_max_new_tokens(len(item.input_ids), n)
        return n

    @property
    def _canned_direct(self) -> bool:
        """Whether canned answers may skip the worker thread: nothing per request is measured there."""
        return self.scheduler is None and not self.enable_metrics

    def _meta_extras(self, job: Job, t_start: float, t_end: float) -> dict[str, Any]:
        """`build_response` arguments from the scheduler's numbers and, with metrics on, the time stats."""
        stats = job.stats or {}
        extras: dict[str, Any] = {
            "num_retractions": stats.get("num_retractions", 0),
            "cached_tokens": stats.get("cached_tokens", 0),
        }
        if self.enable_metrics and job.started_running:
            started = job.t_start or t_start
            sched, req = protocol.metrics_meta_info(
                received_ts=t_start,
                forward_entry_ts=stats.get("forward_entry_ts") or started,
                prefill_finished_ts=stats.get("prefill_finished_ts") or started,
                queue_time=stats.get("queue_time", max(0.0, started - job.t_submit)),
                finished_ts=t_end,
                completion_tokens=len(job.output_ids),
            )
            extras["scheduler_metrics"], extras["request_metrics"] = sched, req
        return extras

    def _answer_canned(self, parsed, t_start: float) -> web.Response:
        """Answer a body from canned answers at once: no job, no worker thread, no text decode; the bytes
        are the prepared answers with the per-request fields filled in."""
        answers = [(item, self.backend.canned_answer(item, self._max_new_tokens(item))) for item in parsed.items]
        e2e = time.time() - t_start
        sent = time.time()
        parts = [answer.render(item.rid, len(item.input_ids), e2e, sent) for item, answer in answers]
        if self.recorder.path is not None or self.die_after is not None:
            for item, answer in answers:
                self._record_answer(item, answer.output_ids, answer.finish_reason, 200, t_start)
        else:
            self.served += len(answers)
        body = parts[0] if parsed.is_single else b"[" + b",".join(parts) + b"]"
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    async def _record_when_done(self, jobs, futures, status: int, t_start: float) -> None:
        await asyncio.wait(futures, timeout=5.0)
        for job in jobs:
            self._record_job(job, status, t_start)

    async def _serve(self, request, body, parsed, jobs, futures, t_start, drawn=None) -> web.StreamResponse:
        kind, status, delay = drawn or self.faults.draw([j.rid for j in jobs])
        if kind in ("fail_rid", "error"):
            detail = f"Injected failure for rid {jobs[0].rid}" if kind == "fail_rid" else f"Injected HTTP {status}"
            self._record_body(body, status, t_start, error=detail, fault=kind)
            for job in jobs:
                job.request_abort()
            return _json({"detail": detail}, status)
        if kind == "reset":
            for job in jobs:
                job.request_abort()
            self._record_body(body, None, t_start, fault="reset")
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable()  # never written: the connection is gone
        if kind == "hang":
            while not _disconnected(request):
                await asyncio.sleep(DISCONNECT_POLL_S)
            for job in jobs:
                job.request_abort()
            self._record_body(body, None, t_start, fault="hang")
            return web.Response(status=499)
        if delay > 0:
            await asyncio.sleep(delay)
        for job in jobs:
            self.backend.submit(job)

        pending = set(futures)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
            if pending and _disconnected(request):
                log.info("client went away; aborting %s", [j.rid for j in jobs])
                for job in jobs:
                    job.request_abort()
                await asyncio.wait(pending, timeout=5.0)
                for job in jobs:
                    self._record_job(job, 499, t_start)
                return web.Response(status=499)

        t_end = time.time()
        e2e = t_end - t_start
        outs = []
        tok = self.backend.tokenizer
        for job in jobs:
            text = job.text
            if text is None:
                text = protocol.decode_output_text(tok, job.output_ids, job.finish_reason, job.params)
            outs.append(
                protocol.build_response(
                    rid=job.rid,
                    text=text,
                    output_ids=job.output_ids,
                    finish_reason=job.finish_reason,
                    prompt_tokens=len(job.input_ids) if job.started_running else None,
                    e2e_latency=e2e,
                    **self._meta_extras(job, t_start, t_end),
                )
            )
        # A request ended by the server itself (status_code 4xx/5xx) fails the whole body, as
        # tokenizer_manager._handle_abort_finish_reason raises for it.
        for job in jobs:
            code = (job.finish_reason or {}).get("status_code")
            if code is not None and 400 <= code < 600:
                msg = job.finish_reason.get("message")
                for j in jobs:
                    self._record_job(j, code, t_start)
                if code == 400:
                    return _json(protocol.error_body(msg), 400)
                return _json(protocol.http_exception_body(msg, code), code)
        for job in jobs:
            self._record_job(job, 200, t_start)
        if parsed.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, out in enumerate(outs):
                if not parsed.is_single:
                    out = dict(out, index=i)
                await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return _json(outs[0] if parsed.is_single else outs)

    # -- other routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready and not self.never_healthy else 503)

    def server_info_dict(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "tokenizer_mode": "auto",
            "skip_tokenizer_init": False,
            "load_format": "auto",
            "trust_remote_code": bool(getattr(self.backend, "trust_remote_code", False)),
            "context_length": self.context_length,
            # scheduler_info (tp_worker.py): min(context, KV pool) - 1 - 5; this engine's pool is unbounded.
            "max_req_input_len": self.scheduler.max_req_input_len if self.scheduler else self.context_length - 6,
            "is_embedding": False,
            "served_model_name": self.model_path,
            "weight_version": protocol.DEFAULT_WEIGHT_VERSION,
            "host": None,
            "port": None,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "max_running_requests": self.max_running_requests,
            "max_total_tokens": self.scheduler.max_total_tokens if self.scheduler else None,
            "reasoning_parser": None,
            "tool_call_parser": None,
            "allow_auto_truncate": False,
            "preferred_sampling_params": None,
            "sampling_defaults": "model",
            "random_seed": None,
            "enable_deterministic_inference": bool(self.backend.deterministic),
            "enable_metrics": self.enable_metrics,
            "startup_time": self.startup_time,
            "internal_states": [],
            "version": self.version,
            "frontend": "python",
            "engine": "local",
            "backend": self.backend.name,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        info = self.server_info_dict()
        host, port = request.url.host, request.url.port
        info["host"], info["port"] = host, port
        return _json(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(
            {
                "model_path": self.model_path,
                "served_model_name": self.model_path,
                "tokenizer_path": self.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": protocol.DEFAULT_WEIGHT_VERSION,
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": self.backend.model_type,
                "architectures": self.backend.architectures,
            }
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            body = {}
        rid = body.get("rid") or ""
        abort_all = bool(body.get("abort_all"))
        if abort_all:
            targets = list(self.inflight.values())
        elif rid and rid in self.inflight:
            # scheduler.abort_request matches by prefix once the rid is known.
            targets = [j for r, j in self.inflight.items() if r.startswith(rid)]
        else:
            targets = []
        for job in targets:
            job.request_abort()
        log.info("abort_request rid=%r abort_all=%s: %d aborted", rid, abort_all, len(targets))
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.inflight:
            return web.Response(text="Flush cache failed.\n", status=400)
        if self.scheduler is not None:
            self.backend.request_flush_cache()
        return web.Response(
            text=(
                "Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be "
                "performed.)\n"
            ),
            status=200,
        )

    # -- loads
    @property
    def max_running_requests(self) -> int:
        return self.scheduler.max_running_requests if self.scheduler is not None else self.backend.max_batch

    def load_snapshots(self) -> list[dict[str, Any]]:
        """One load snapshot per DP rank (one rank): the scheduler's last, or the requests in flight.

        Without the capacity model the pool is taken as `max_running_requests` rows of the full
        context, and a request counts as running once the backend has started it."""
        if self.scheduler is not None:
            return [dict(self.backend.load_snapshot, timestamp=time.time())]
        running, waiting = [], []
        for job in list(self.inflight.values()):
            if job.state == RUNNING:
                running.append((len(job.input_ids), len(job.output_ids)))
            elif job.state == WAITING:
                waiting.append(len(job.input_ids))
        return [
            loads.inflight_snapshot(
                running=running,
                waiting_tokens=waiting,
                max_running_requests=self.backend.max_batch,
                max_total_tokens=self.backend.max_batch * self.context_length,
                timestamp=time.time(),
            )
        ]

    async def v1_loads(self, request: web.Request) -> web.Response:
        query = request.rel_url.query
        raw_rank = query.get("dp_rank")
        include = query.get("include")
        dp_rank = None
        if raw_rank is not None:
            try:
                dp_rank = int(raw_rank)
            except ValueError:
                # FastAPI's query validation, answered by http_server's RequestValidationError handler.
                err = [{"type": "int_parsing", "loc": ("query", "dp_rank"),
                        "msg": "Input should be a valid integer, unable to parse string as an integer",
                        "input": raw_rank}]  # fmt: skip
                return _json({"object": "error", "message": str(err), "type": "Bad Request", "param": None,
                              "code": 400}, 400)  # fmt: skip
        if self.legacy:
            try:
                body = loads.legacy_v1_loads(
                    self.load_snapshots(), include=include, dp_rank=dp_rank, version=self.version
                )
            except ValueError as e:
                return _json(protocol.http_exception_body(str(e), 400), 400)
            return _json(body)
        snapshots = loads.select_rank(self.load_snapshots(), dp_rank)
        try:
            if query.get("format") == "prometheus":
                text = loads.v1_loads_prometheus(snapshots, include=include)
                return web.Response(
                    body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
                )
            return _json(loads.v1_loads(snapshots, include=include, version=self.version))
        except ValueError as e:
            # Raised by LoadSnapshot.to_dict outside v1_loads.get_loads' try: FastAPI's bare 500.
            log.error("/v1/loads failed: %s", e)
            return web.Response(text="Internal Server Error", status=500)

    async def get_load(self, request: web.Request) -> web.Response:
        if not self.legacy:
            return _json({"detail": "Not Found"}, 404)  # 0.5.23 has no /get_load: FastAPI's 404
        log.warning(
            "Endpoint '/get_load' is deprecated and will be removed in a future version. "
            "Please use '/v1/loads' instead."
        )
        return _json(loads.get_load(self.load_snapshots()))


def _version_tuple(version: str) -> tuple[int, ...]:
    """ "0.5.8.post1" -> (0, 5, 8): the leading numeric parts."""
    parts = []
    for piece in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


ENGINE_KEY = web.AppKey("engine", EngineServer)


def _deprecated(old: str, new: str, handler):
    """0.5.23's `get_` routes: the same answer, and a warning in the server log (http_server.py)."""

    async def route(request: web.Request) -> web.Response:
        log.warning(
            "Endpoint '%s' is deprecated and will be removed in a future version. Please use '%s' instead.", old, new
        )
        return await handler(request)

    return route


def create_app(
    backend: Backend,
    *,
    context_length: int,
    model_path: str,
    tokenizer_path: str,
    record_path: Path | None = None,
    version: str = protocol.SGLANG_VERSION,
    faults: Faults | None = None,
    enable_metrics: bool = False,
) -> web.Application:
    """The local engine's web app. The backend starts (loads) in the background at app start;
    `/health` answers 503 until it is ready."""
    srv = EngineServer(
        backend,
        context_length=context_length,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        record_path=record_path,
        version=version,
        faults=faults,
        enable_metrics=enable_metrics,
    )
    app = web.Application(client_max_size=1 << 30)
    app[ENGINE_KEY] = srv
    app.on_startup.append(srv.on_startup)
    app.on_cleanup.append(srv.on_cleanup)
    app.router.add_post("/generate", srv.generate)
    app.router.add_put("/generate", srv.generate)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, srv.health)
    app.router.add_get("/server_info", srv.server_info)
    app.router.add_get("/model_info", srv.model_info)
    app.router.add_get("/get_server_info", _deprecated("/get_server_info", "/server_info", srv.server_info))
    app.router.add_get("/get_model_info", _deprecated("/get_model_info", "/model_info", srv.model_info))
    app.router.add_post("/abort_request", srv.abort_request)
    app.router.add_get("/flush_cache", srv.flush_cache)
    app.router.add_post("/flush_cache", srv.flush_cache)
    app.router.add_get("/v1/loads", srv.v1_loads)
    app.router.add_get("/get_load", srv.get_load)
    return app
