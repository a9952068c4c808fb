"""One request on its way through a backend (`Job`), and the worker-thread machinery every backend
shares (`Backend`: the queue, the worker thread, start and close).

Imports `protocol` only.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from eagle3_datagen.engine.protocol.finish import finish_abort_waiting, stop_token_ids
from eagle3_datagen.engine.protocol.parsing import GenerateItem
from eagle3_datagen.engine.protocol.responses import PreparedResponse
from eagle3_datagen.engine.protocol.sampling import SamplingParams

log = logging.getLogger(__name__)

WAITING, RUNNING, DONE = "waiting", "running", "done"


class Job:
    """One single request on its way through a backend.

    `state` moves waiting → running → done under `lock`; an abort of a waiting job resolves it at
    once (SGLang's "Abort in waiting queue"), an abort of a running one is seen by the worker at
    its next step and ends it with the partial output.

    A streamed job is watched (`watch`): the worker calls `progressed` after appending output
    tokens, and the job tells the server when SGLang's scheduler would send a chunk
    (output_streamer.accept: the first token at once, then whenever `stream_interval` tokens are
    unsent; `sent` is the output length of the last chunk told). `loop` is the repetition loop
    the request was made to fall into (`loops.LoopPlan`), or None.
    """

    def __init__(
        self,
        item: GenerateItem,
        *,
        max_new_tokens: int,
        on_done: Callable[["Job"], None],
    ):
        self.item = item
        self.rid = item.rid
        self.input_ids: list[int] = list(item.input_ids)
        self.params: SamplingParams = item.params
        self.max_new_tokens = max_new_tokens
        self.output_ids: list[int] = []
        self.finish_reason: dict[str, Any] | None = None
        self.started_running = False
        # Set by whoever knows them before the answer is built: a canned answer to copy (scripted
        # `canned` mode), the decoded `text`, and the scheduler's per-request numbers (`num_retractions`,
        # `cached_tokens`, `queue_time`, and the wall-clock `forward_entry_ts`/`prefill_finished_ts`).
        self.canned: PreparedResponse | None = None
        self.text: str | None = None
        self.stats: dict[str, Any] | None = None
        self.t_submit = time.time()
        self.t_start: float | None = None
        self.loop = None
        self.sent = 0
        self.stream_interval = 1
        self._notify: Callable[[], None] | None = None
        self._on_done = on_done
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self.state = WAITING

    def try_start(self) -> bool:
        with self._lock:
            if self.state != WAITING:
                return False
            self.state = RUNNING
            self.started_running = True
            self.t_start = time.time()
            return True

    def watch(self, notify: Callable[[], None], stream_interval: int) -> None:
        """Stream this job: `notify` (thread-safe) whenever a chunk is due."""
        self.stream_interval = max(1, stream_interval)
        self._notify = notify

    @property
    def watched(self) -> bool:
        return self._notify is not None

    def progressed(self) -> None:
        """Called by the worker after appending output tokens: tell the server when a chunk is due."""
        notify = self._notify
        if notify is None:
            return
        n = len(self.output_ids)
        unsent = n - self.sent
        if unsent > 0 and (unsent >= self.stream_interval or self.sent == 0):
            self.sent = n
            notify()

    @property
    def abort_requested(self) -> bool:
        return self._abort.is_set()

    def request_abort(self) -> None:
        """Abort from any thread; the job ends with finish_reason abort."""
        with self._lock:
            if self.state == DONE:
                return
            if self.state == WAITING:
                self.state = DONE
                self.finish_reason = finish_abort_waiting()
                resolve = True
            else:
                self._abort.set()
                resolve = False
        if resolve:
            self._on_done(self)

    def finish(self, finish_reason: dict[str, Any]) -> None:
        with self._lock:
            if self.state == DONE:
                return
            self.state = DONE
            self.finish_reason = finish_reason
        self._on_done(self)

    def finish_canned(self) -> None:
        """End with the canned answer set on the job (nothing is generated)."""
        answer = self.canned
        self.output_ids.extend(answer.output_ids)
        self.text = answer.text
        self.finish(dict(answer.finish_reason))


def ignore_done(job: Job) -> None:
    """An `on_done` for a job nobody waits on."""


class Backend:
    """Shared worker-thread machinery. Subclasses implement `load` and `_work`."""

    name = "backend"
    canned = False  # the scripted backend's speed mode: one answer for every request

    def __init__(self, *, max_batch: int = 16, deterministic: bool = False):
        self.max_batch = max_batch
        # SGLang 0.5.23 builds the per-request seed tensor only with --enable-deterministic-inference
        # (sampling_batch_info.py): without it a request's sampling_seed has no effect.
        self.deterministic = deterministic
        self.tokenizer: Any = None
        self.eos_token_ids: frozenset = frozenset()
        self.vocab_size: int | None = None
        self.model_type: str | None = None
        self.architectures: list[str] | None = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.ready = threading.Event()

    # -- lifecycle
    def load(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Load (blocking) and start the worker thread."""
        self.load()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-worker", daemon=True)
        self._thread.start()
        self.ready.set()

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        job.t_submit = time.time()
        self._queue.put(job)

    # -- worker
    def _take(self, block: bool, limit: int) -> list[Job]:
        """Up to `limit` queued jobs (none when `limit` is 0: a full batch admits nothing)."""
        jobs: list[Job] = []
        if limit <= 0:
            if block:
                self._closing.wait(0.001)
            return jobs
        try:
            first = self._queue.get(timeout=0.1) if block else self._queue.get_nowait()
        except queue.Empty:
            return jobs
        if first is None:
            return jobs
        jobs.append(first)
        while len(jobs) < limit:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                break
            jobs.append(nxt)
        return jobs

    def _run(self) -> None:
        try:
            self._work()
        except Exception:
            log.exception("%s worker failed", self.name)
            raise

    def _work(self) -> None:
        raise NotImplementedError

    # -- shared by the subclasses
    def stop_ids_for(self, params: SamplingParams) -> frozenset:
        return stop_token_ids(self.eos_token_ids, params)

    def decode_fn(self, params: SamplingParams):
        if not params.stop_strs:
            return None
        tok = self.tokenizer
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False)
