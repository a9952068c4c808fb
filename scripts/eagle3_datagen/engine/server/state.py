"""The state behind the routes (`EngineServer`: the backend, requests in flight, the record, the
faults, the server's limits) and the app key the routes find it under (`ENGINE_KEY`).

Every request served is appended to `record_path` as one JSON line when it ends (`Recorder`): one
line per single request of a body that ran, one line per body refused or failed as a whole. Keys:
`rid`, `input_ids`, `sampling_params` (as received), `output_ids`, `finish_reason`, `status` (HTTP
status; 499 when the client went away first, null for an injected reset or hang), `t_start`,
`t_end`, `error`, `fault`, and `loop` on a request's line: `{"onset", "period"}` when it was made to
loop (`backends.loops`), else null.

Imports `protocol`, `backends.jobs`, `backends.loops` and `server.faults`.
"""

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from eagle3_datagen.engine.backends.jobs import Backend, Job
from eagle3_datagen.engine.backends.loops import LoopInjection
from eagle3_datagen.engine.protocol.parsing import GenerateItem, effective_max_new_tokens
from eagle3_datagen.engine.server.faults import Faults

log = logging.getLogger(__name__)


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


def read_record(path: Path) -> list[dict]:
    """The lines `Recorder` wrote, in the order written (for the tests and benchmarks that check what
    was served)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


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
        incremental_streaming_output: bool = False,
        stream_interval: int = 1,
        loops: LoopInjection | None = None,
    ):
        self.backend = backend
        self.incremental_streaming_output = incremental_streaming_output
        self.stream_interval = stream_interval
        self.loops = loops or LoopInjection()
        self.scheduler = getattr(backend, "scheduler", None)
        self.enable_metrics = enable_metrics
        self.legacy = version_tuple(version) < (0, 5, 23)
        self.context_length = context_length
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.version = version
        self.faults = faults or Faults()
        self.recorder = Recorder(record_path)
        self.inflight: dict[str, Job] = {}
        self.load_s: float | None = None  # how long the backend took to start
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
                t0 = time.time()
                await loop.run_in_executor(None, self.backend.start)
                self.load_s = time.time() - t0
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
    def record_body(self, body: Any, status: int | None, t_start: float, *, error=None,
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

    def record_job(self, job: Job, status: int, t_start: float) -> None:
        self.record_answer(job.item, job.output_ids, job.finish_reason, status, t_start, loop=job.loop)

    def record_answer(self, item: GenerateItem, output_ids, finish_reason, status: int, t_start: float,
                      loop=None) -> None:  # fmt: skip
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
            loop=loop.as_dict() if loop is not None else None,
        )
        if status == 200:
            self.served += 1
            if self.die_after is not None and self.served >= self.die_after:
                log.error("dying on purpose after %d requests (--die-after)", self.served)
                self.recorder.close()
                os._exit(5)

    # -- limits
    def tokenize(self, text: str) -> list[int]:
        return list(self.backend.tokenizer.encode(text))

    def max_new_tokens(self, item: GenerateItem) -> int:
        """`scheduler.init_req_max_new_tokens`: the request's budget clamped to what the context (and
        the scheduler's KV pool) allows."""
        n = effective_max_new_tokens(len(item.input_ids), item.params.max_new_tokens, self.context_length)
        if self.scheduler is not None:
            n = self.scheduler.clip_max_new_tokens(len(item.input_ids), n)
        return n

    @property
    def max_running_requests(self) -> int:
        return self.scheduler.max_running_requests if self.scheduler is not None else self.backend.max_batch

    @property
    def canned_direct(self) -> bool:
        """Whether canned answers may skip the worker thread: nothing per request is measured there."""
        return self.scheduler is None and not self.enable_metrics

    def in_background(self, coro: Coroutine) -> None:
        """Run `coro` as a task that `on_cleanup` waits for."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def version_tuple(version: str) -> tuple[int, ...]:
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
