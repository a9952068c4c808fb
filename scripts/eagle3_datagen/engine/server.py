"""The state behind the web app's routes (`EngineServer`), the injected faults (`Faults`), and the
routes besides `/generate` (SGLang's names): `/health`, `/server_info`, `/model_info`, `/abort_request`,
`/flush_cache` (no prefix cache here: it only refuses while requests are in flight), `/v1/loads`.

The record (`record_path`) gets one JSON line per body: `rid`, `input_ids`, `sampling_params` (as
received), `output_ids`, `finish_reason`, `status` (499: the client went away first; null: an injected
reset or hang), `t_start`, `t_end`, `error`, `fault`, and where the request ran `loop` ({"onset",
"period"} or null). Imports `settings`, `protocol`, `capacity`, `jobs` and `loops`.
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

from eagle3_datagen.engine.capacity import load_entry
from eagle3_datagen.engine.jobs import RUNNING, WAITING, Backend, Job
from eagle3_datagen.engine.loops import LoopInjection
from eagle3_datagen.engine.protocol import GenerateItem, dumps, effective_max_new_tokens
from eagle3_datagen.settings import SGLANG_VERSION

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Faults:
    """Injected misbehaviour of `/generate`, drawn per HTTP request from `random.Random(seed)`:
    `latency_ms` (lo, hi) added before it runs; `error_rate` HTTP 500 or 503 (even odds);
    `reset_rate` a closed connection; `hang_rate` no answer until the client goes away; `fail_rids`
    a regex, a body with a rid it matches always gets HTTP 500; `cut_rate` a streamed answer whose
    connection is dropped once it has sent `cut_after` (lo, hi) ids or more (a chunk boundary)."""

    latency_ms: tuple[float, float] | None = None
    error_rate: float = 0.0
    reset_rate: float = 0.0
    hang_rate: float = 0.0
    fail_rids: str | None = None
    seed: int = 0
    cut_rate: float = 0.0
    cut_after: tuple[int, int] = (1, 1024)

    def __post_init__(self):
        if not 0.0 <= self.error_rate + self.reset_rate + self.hang_rate <= 1.0:
            raise ValueError("fault rates must add up to at most 1")
        self._rng = random.Random(self.seed)
        self._fail = re.compile(self.fail_rids) if self.fail_rids else None

    def draw(self, rids: list[str]) -> tuple[str | None, int | None, float]:
        """(fault kind or None, HTTP status for "error", latency in seconds) for one request."""
        if self._fail is not None and any(self._fail.search(rid) for rid in rids):
            return "fail_rid", 500, 0.0
        u, edges = self._rng.random(), itertools.accumulate((self.reset_rate, self.hang_rate, self.error_rate))
        kind = next((kind for kind, edge in zip(("reset", "hang", "error"), edges) if u < edge), None)
        status = self._rng.choice((500, 503)) if kind == "error" else None
        delay = self._rng.uniform(*self.latency_ms) / 1000.0 if self.latency_ms else 0.0
        return kind, status, delay

    def cut(self) -> int | None:
        """The streamed ids after which a stream's connection is dropped, or None (drawn only with a
        `cut_rate`: the other faults' draws stay as they were)."""
        if self.cut_rate and self._rng.random() < self.cut_rate:
            return self._rng.randint(int(self.cut_after[0]), int(self.cut_after[1]))
        return None


def read_record(path: Path) -> list[dict]:
    """The lines `--record` wrote, in order (for the tests and benchmarks that check what was served)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(data), status=status, content_type="application/json")


class EngineServer:
    """State behind the routes: the backend, requests in flight, the record, the faults, the options."""

    def __init__(self, backend: Backend, *, context_length: int, model_path: str, tokenizer_path: str,
                 record_path: Path | None = None, faults: Faults | None = None, enable_metrics: bool = False,
                 incremental_streaming_output: bool = False, stream_interval: int = 1,
                 loops: LoopInjection | None = None):  # fmt: skip
        self.backend, self.scheduler, self.context_length = backend, backend.scheduler, context_length
        self.model_path, self.tokenizer_path = model_path, tokenizer_path
        self.faults, self.loops = faults or Faults(), loops or LoopInjection()
        self.enable_metrics, self.stream_interval = enable_metrics, stream_interval
        self.incremental_streaming_output = incremental_streaming_output
        self._record = None
        if record_path is not None:
            Path(record_path).parent.mkdir(parents=True, exist_ok=True)
            self._record = open(record_path, "a", encoding="utf-8")
        self.inflight: dict[str, Job] = {}
        self.load_error: BaseException | None = None
        self._start_task: asyncio.Task | None = None
        self.background: set = set()
        self.never_healthy, self.die_after, self.served = False, None, 0  # the CLI's test modes

    async def on_startup(self, app: web.Application) -> None:
        async def start():
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.backend.start)
                log.info("backend %s ready", self.backend.name)
            except BaseException as e:  # reported through /health and the CLI's exit code
                self.load_error = e
                log.exception("backend failed to start")

        self._start_task = asyncio.create_task(start())

    async def on_cleanup(self, app: web.Application) -> None:
        for job in list(self.inflight.values()):
            job.request_abort()
        await asyncio.gather(self._start_task, *self.background, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.backend.close)
        if self._record is not None:
            self._record.close()
            self._record = None

    @property
    def ready(self) -> bool:
        return self.backend.alive and self.load_error is None

    def _write(self, **row: Any) -> None:
        if self._record is not None:
            self._record.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._record.flush()

    def record_body(self, body: Any, status: int | None, t_start: float, *, error=None, fault=None) -> None:
        """A body refused or failed as a whole."""
        body = body if isinstance(body, dict) else {}
        self._write(rid=body.get("rid"), input_ids=body.get("input_ids"), sampling_params=body.get("sampling_params"),
                    output_ids=None, finish_reason=None, status=status, t_start=t_start, t_end=time.time(),
                    error=error, fault=fault)  # fmt: skip

    def record_job(self, job: Job, status: int, t_start: float) -> None:
        item, loop = job.item, job.loop
        self._write(rid=item.rid, input_ids=item.input_ids, sampling_params=item.sampling_params,
                    output_ids=list(job.output_ids), finish_reason=job.finish_reason, status=status, t_start=t_start,
                    t_end=time.time(), error=None, fault=None, loop=dataclasses.asdict(loop) if loop else None)  # fmt: skip
        if status == 200:
            self.served += 1
            if self.die_after is not None and self.served >= self.die_after:
                log.error("dying on purpose after %d requests (--die-after)", self.served)
                os._exit(5)

    def max_new_tokens(self, item: GenerateItem) -> int:
        """The request's budget clamped to what the context (and the simulated KV pool) allows."""
        n = effective_max_new_tokens(len(item.input_ids), item.params.max_new_tokens, self.context_length)
        return self.scheduler.clip_max_new_tokens(len(item.input_ids), n) if self.scheduler else n

    def load(self) -> dict[str, Any]:
        """This rank's `/v1/loads` entry: the simulated GPU's, else the jobs in flight (a pool of `max_batch` contexts)."""
        if self.scheduler is not None:
            return dict(self.backend.load_snapshot, timestamp=time.time())
        jobs = list(self.inflight.values())
        running = [len(j.input_ids) + len(j.output_ids) for j in jobs if j.state == RUNNING]
        waiting = [len(j.input_ids) for j in jobs if j.state == WAITING]
        return load_entry(running=len(running), waiting=len(waiting), used=sum(running),
                          waiting_tokens=sum(waiting), max_total_tokens=self.backend.max_batch * self.context_length,
                          max_running_requests=self.backend.max_batch, timestamp=time.time())  # fmt: skip

    def server_info(self) -> dict[str, Any]:
        """What the client reads of `/server_info` (max_req_input_len: SGLang's min(context, KV pool) - 6)."""
        sched, backend = self.scheduler, self.backend
        info = dict(model_path=self.model_path, tokenizer_path=self.tokenizer_path, skip_tokenizer_init=False,
                    context_length=self.context_length, reasoning_parser=None, tool_call_parser=None,
                    allow_auto_truncate=False, max_running_requests=sched and sched.max_running_requests,
                    max_total_tokens=sched and sched.max_total_tokens, trust_remote_code=backend.trust_remote_code,
                    max_req_input_len=sched.max_req_input_len if sched else self.context_length - 6,
                    enable_deterministic_inference=backend.deterministic, enable_metrics=self.enable_metrics,
                    stream_interval=self.stream_interval, version=SGLANG_VERSION, engine="local", backend=backend.name)  # fmt: skip
        return {**info, "incremental_streaming_output": self.incremental_streaming_output}


ENGINE_KEY = web.AppKey("engine", EngineServer)


async def health(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    return web.Response(status=200 if srv.ready and not srv.never_healthy else 503)


async def server_info(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE_KEY].server_info())


async def model_info(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    return json_response({"model_path": srv.model_path, "tokenizer_path": srv.tokenizer_path, "is_generation": True,
                          "model_type": srv.backend.model_type, "architectures": srv.backend.architectures})  # fmt: skip


async def read_json(request: web.Request) -> Any:
    """The body as JSON, or a 400 answer (as FastAPI refuses a body that is not JSON) to return."""
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    raw = await request.read()
    if not raw or not (content_type == "application/json" or content_type.endswith("+json")):
        return json_response({"detail": "the body must be JSON (Content-Type: application/json)"}, 400)
    try:
        return orjson.loads(raw)
    except ValueError as e:
        return json_response({"detail": f"JSON decode error: {e}"}, 400)


async def abort_request(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    body = await read_json(request)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body, dict) or not isinstance(body.get("rid") or "", str):
        return json_response({"detail": 'expected {"rid": str, "abort_all": bool}'}, 400)
    rid = body.get("rid") or ""
    if body.get("abort_all"):
        targets = list(srv.inflight.values())
    else:  # SGLang matches by prefix once the rid is known
        targets = [j for r, j in srv.inflight.items() if r.startswith(rid)] if rid in srv.inflight else []
    for job in targets:
        job.request_abort()
    log.info("abort_request rid=%r: %d aborted", rid, len(targets))
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    if request.app[ENGINE_KEY].inflight:
        return web.Response(text="Flush cache failed.\n", status=400)
    return web.Response(text="Cache flushed.\n", status=200)


async def v1_loads(request: web.Request) -> web.Response:
    srv = request.app[ENGINE_KEY]
    rank = request.rel_url.query.get("dp_rank")
    if rank is not None and not rank.lstrip("-").isdigit():
        return json_response({"detail": f"dp_rank must be an integer, got {rank!r}"}, 400)
    loads = [srv.load()] if rank is None or int(rank) == 0 else []
    return json_response({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                          "version": SGLANG_VERSION, "loads": loads})  # fmt: skip
