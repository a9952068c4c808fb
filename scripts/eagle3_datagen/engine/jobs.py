"""One request on its way through a backend (`Job`), and what both backends share (`Backend`: the
worker thread and its queue, and what is read from a model or tokenizer directory: the tokenizer,
`config.json`, the ids that end generation). Imports `protocol` only (transformers to load a tokenizer).
"""

import functools
import json
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_datagen.engine.protocol import GenerateItem, finish_abort_waiting

log = logging.getLogger(__name__)

WAITING, RUNNING, DONE = "waiting", "running", "done"
# Turn-final markers SGLang adds to the stop ids when the tokenizer's added vocabulary holds them.
ADDITIONAL_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")


@functools.lru_cache(maxsize=8)
def load_tokenizer(tokenizer_dir: Path, trust_remote_code: bool = False):
    """A tokenizer per directory, loaded once per process (engines restarted in tests share it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code)


def read_eos_token_ids(model_dir: Path | None, tokenizer_eos_id: int | None, added_vocab=None) -> frozenset:
    """The ids that end generation as SGLang builds them: config.json's and generation_config.json's
    `eos_token_id` (int or list), the tokenizer's eos id, and the turn-final markers it holds."""
    ids = {int(tokenizer_eos_id)} if tokenizer_eos_id is not None else set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name if model_dir is not None else None
        value = json.loads(path.read_text()).get("eos_token_id") if path is not None and path.is_file() else None
        ids.update([value] if isinstance(value, int) else value or [])
    ids.update(added_vocab[text] for text in ADDITIONAL_STOP_TEXTS if text in (added_vocab or {}))
    return frozenset(int(i) for i in ids)


class Job:
    """A request in a backend: `state` moves waiting -> running -> done under a lock. An abort of a
    waiting job resolves it at once, of a running one at the worker's next step (with the output so far).
    `loop`: the `loops.LoopPlan` it was made to fall into, or None."""

    def __init__(self, item: GenerateItem, *, max_new_tokens: int, on_done: Callable[["Job"], None]):
        self.item, self.rid, self.params, self.max_new_tokens = item, item.rid, item.params, max_new_tokens
        self.input_ids: list[int] = list(item.input_ids)
        self.output_ids: list[int] = []
        self.finish_reason: dict[str, Any] | None = None
        self.state, self.started_running = WAITING, False
        # Set by the backend where known: the scheduler's `num_retractions` and `queue_time`.
        self.stats: dict[str, Any] = {}
        self.loop = None
        self.sent, self.stream_interval = 0, 1
        self._notify: Callable[[], None] | None = None
        self._on_done = on_done
        self._abort = threading.Event()
        self._lock = threading.Lock()

    def try_start(self) -> bool:
        with self._lock:
            if self.state != WAITING:
                return False
            self.state, self.started_running = RUNNING, True
            return True

    def watch(self, notify: Callable[[], None], stream_interval: int) -> None:
        """Stream this job: `notify` (thread-safe) when a chunk is due: the first token at once, then
        every `stream_interval` tokens."""
        self.stream_interval = max(1, stream_interval)
        self._notify = notify

    def progressed(self) -> None:
        """Called by the worker after appending tokens."""
        n = len(self.output_ids)
        if self._notify is not None and n > self.sent and (n - self.sent >= self.stream_interval or not self.sent):
            self.sent = n
            self._notify()

    @property
    def abort_requested(self) -> bool:
        return self._abort.is_set()

    def request_abort(self) -> None:
        """Abort from any thread; the job ends with finish_reason abort."""
        with self._lock:
            if self.state == DONE:
                return
            resolve = self.state == WAITING
            if resolve:
                self.state, self.finish_reason = DONE, finish_abort_waiting()
            else:
                self._abort.set()
        if resolve:
            self._on_done(self)

    def finish(self, finish_reason: dict[str, Any]) -> None:
        with self._lock:
            if self.state == DONE:
                return
            self.state, self.finish_reason = DONE, finish_reason
        self._on_done(self)


class Backend:
    """Shared worker-thread machinery. Subclasses implement `load` (blocking) and `_work` (the worker loop)."""

    name = "backend"
    scheduler = None  # the scripted backend's simulated GPU (`capacity.KVScheduler`), if any

    def __init__(self, *, max_batch: int = 16, deterministic: bool = False):
        # SGLang honours a request's sampling_seed only with --enable-deterministic-inference.
        self.max_batch, self.deterministic, self.trust_remote_code = max_batch, deterministic, False
        self.tokenizer: Any = None
        self.eos_token_ids: frozenset = frozenset()
        self.vocab_size: int | None = None
        self.model_type = self.architectures = None
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self.ready = threading.Event()

    def load_facts(self, model_dir: Path | None, tokenizer_dir: Path) -> None:
        """The tokenizer, the model's type and architectures (config.json) and the ids that end generation."""
        tok = self.tokenizer = load_tokenizer(tokenizer_dir, self.trust_remote_code)
        config = Path(model_dir) / "config.json" if model_dir is not None else None
        cfg = json.loads(config.read_text()) if config is not None and config.is_file() else {}
        self.model_type, self.architectures = cfg.get("model_type"), cfg.get("architectures")
        facts_dir = model_dir if model_dir is not None else tokenizer_dir
        self.eos_token_ids = read_eos_token_ids(facts_dir, tok.eos_token_id, tok.get_added_vocab())
        self.vocab_size = len(tok)

    def start(self) -> None:
        self.load()
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-worker", daemon=True)
        self._thread.start()
        self.ready.set()

    @property
    def alive(self) -> bool:
        return self.ready.is_set() and self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._closing.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def _take(self, block: bool, limit: int) -> list[Job]:
        """Up to `limit` queued jobs (none when `limit` is 0: a full batch admits nothing)."""
        jobs: list[Job] = []
        if limit <= 0 and block:
            self._closing.wait(0.001)
        try:
            while len(jobs) < limit:
                job = self._queue.get(timeout=0.1) if block and not jobs else self._queue.get_nowait()
                if job is None:
                    break
                jobs.append(job)
        except queue.Empty:
            pass
        return jobs

    def _run(self) -> None:
        try:
            self._work()  # the subclass's worker loop
        except Exception:
            log.exception("%s worker failed", self.name)
            raise
