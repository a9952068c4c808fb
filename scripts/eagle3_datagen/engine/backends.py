"""Token generators behind the local engine: a transformers model on CPU, or a scripted stand-in.

Both take `Job`s from any thread (`submit`) and run them on one worker thread of their own. A job
reports back through its `on_done` callback, from the worker thread. Stopping follows
`protocol.check_finish` in both, so the two backends agree on every finish rule.

- `ModelBackend`: continuous batching. New requests are prefilled alone, then joined to the running
  batch (left padding plus an attention mask and explicit positions); each row stops on its own.
- `ScriptedBackend`: no model; deterministic reasoning-shaped outputs from a hash of the prompt and
  seed, produced at once (or at a configured pace per token, so that aborts find them running).
  With a `capacity.KVScheduler` it behaves like a GPU of that capacity instead: every answer is made
  at once, then paced by the simulated scheduler, whose step times the worker sleeps in real time.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import math
import queue
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_datagen.engine import protocol
from eagle3_datagen.engine.capacity import KVScheduler, RequestStats
from eagle3_datagen.engine.protocol import GenerateItem, SamplingParams

log = logging.getLogger(__name__)

WAITING, RUNNING, DONE = "waiting", "running", "done"


class Job:
    """One single request on its way through a backend.

    `state` moves waiting → running → done under `lock`; an abort of a waiting job resolves it at
    once (SGLang's "Abort in waiting queue"), an abort of a running one is seen by the worker at
    its next step and ends it with the partial output.
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
        self.canned: protocol.PreparedResponse | None = None
        self.text: str | None = None
        self.stats: dict[str, Any] | None = None
        self.t_submit = time.time()
        self.t_start: float | None = None
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
                self.finish_reason = protocol.finish_abort_waiting()
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


def _ignore(job: Job) -> None:
    pass


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
        return protocol.stop_token_ids(self.eos_token_ids, params)

    def decode_fn(self, params: SamplingParams):
        if not params.stop_strs:
            return None
        tok = self.tokenizer
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


@functools.lru_cache(maxsize=8)
def load_tokenizer(tokenizer_dir: Path, trust_remote_code: bool = False):
    """A tokenizer per directory, loaded once per process (engines restarted in tests share it).

    `trust_remote_code` as SGLang's `--trust-remote-code`: Kimi's TikToken tokenizer is remote code."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code)


def _read_config(model_dir: Path | None) -> dict[str, Any]:
    if model_dir is None:
        return {}
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


# =============================================================================================
# Scripted backend


class ScriptedBackend(Backend):
    """Deterministic, instant outputs shaped like a reasoning model's, from a tokenizer alone.

    Per request, a RNG seeded from sha256(input_ids, sampling_seed) picks one of:
    - `answer`: [`<think>` "\\n" if the prompt does not end in it] reasoning words, `</think>`,
      "\\n\\n", answer words, then the stop token;
    - `tool` (only when the tokenizer has Kimi's `<|tool_calls_section_begin|>` or Qwen's
      `<tool_call>` and the prompt declares tools): reasoning, `</think>`, a tool-call section, stop;
    - `ramble`: reasoning words without end, running to `max_new_tokens` (finish length).
    Stopping, `min_new_tokens`, `ignore_eos`, `stop_token_ids` and stop strings follow the same
    rules as the model backend. Every special id is read from the tokenizer.

    `answer_tokens=(lo, hi)` makes answers long, as a thinking model's are: the reasoning runs to a
    length drawn uniformly from [lo, hi] tokens per request (scale benchmarks). Such answers are
    made whole rather than token by token where no stop string or min_new_tokens asks for the
    token-wise rules, so that a CPU serves hundreds of millions of tokens.

    `canned=True` is a speed mode for benchmarking clients: the answer is planned once, from the
    first request's prompt, and every request gets it (`canned_answer`), cut by its own
    `max_new_tokens` and stopping parameters under the same rules; one prepared answer per
    distinct set of those. The server then answers without the worker thread where it can, from
    the answer's pre-serialized bytes. `token_delay_s` does not apply to canned answers.
    """

    name = "scripted"
    WORDS = (
        "The user asks about this. Let me think step by step. First, consider the numbers; "
        "then add them carefully. We should check the result twice, since small errors matter. "
        "Hmm, wait: the second value is larger than the first, so the order changes. "
        "Overall the answer follows from these facts, and it is 42 or close to it."
    )

    def __init__(
        self,
        tokenizer_dir: Path,
        *,
        model_dir: Path | None = None,
        token_delay_s: float = 0.0,
        max_batch: int = 16,
        ramble_rate: float = 0.15,
        tool_rate: float = 0.5,
        eos_rate: float = 0.0,
        trust_remote_code: bool = False,
        deterministic: bool = False,
        answer_tokens: tuple[int, int] | None = None,
        answer_spread: str = "uniform",
        canned: bool = False,
        scheduler: KVScheduler | None = None,
    ):
        super().__init__(max_batch=max_batch, deterministic=deterministic)
        self.scheduler = scheduler
        # The scheduler's `load()` as of its last step, published by the worker for `/v1/loads`.
        self.load_snapshot: dict[str, Any] | None = scheduler.load() if scheduler is not None else None
        self.clock_origin = time.time()  # wall-clock time of the scheduler's virtual 0
        self._flush_cache = threading.Event()
        self.trust_remote_code = trust_remote_code
        self.answer_tokens = answer_tokens
        self.answer_spread = answer_spread
        self.canned = canned
        self._canned_origin: tuple[list[int], int | None] | None = None
        self._canned_answers: dict[tuple, protocol.PreparedResponse] = {}
        self._canned_lock = threading.Lock()
        self.tokenizer_dir = Path(tokenizer_dir)
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.token_delay_s = token_delay_s
        self.ramble_rate = ramble_rate
        self.tool_rate = tool_rate
        self.eos_rate = eos_rate

    def load(self) -> None:
        tok = load_tokenizer(self.tokenizer_dir, self.trust_remote_code)
        self.tokenizer = tok
        self.vocab_size = len(tok)
        cfg = _read_config(self.model_dir)
        self.model_type = cfg.get("model_type")
        self.architectures = cfg.get("architectures")
        self.eos_token_ids = protocol.read_eos_token_ids(
            self.model_dir if self.model_dir is not None else self.tokenizer_dir,
            tok.eos_token_id,
            tok.get_added_vocab(),
        )

        def tid(token: str) -> int | None:
            i = tok.convert_tokens_to_ids(token)
            return None if i is None or i == tok.unk_token_id and token != tok.unk_token else i

        self.think_id = tid("<think>")
        self.think_end_id = tid("</think>")
        self.kimi_tool = {
            name: tid(name)
            for name in (
                "<|tool_calls_section_begin|>",
                "<|tool_calls_section_end|>",
                "<|tool_call_begin|>",
                "<|tool_call_argument_begin|>",
                "<|tool_call_end|>",
            )
        }
        self.qwen_tool = {name: tid(name) for name in ("<tool_call>", "</tool_call>")}
        enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
        self.word_ids = [enc((" " if i else "") + w) for i, w in enumerate(self.WORDS.split())]
        self.enc = enc
        special = set(tok.all_special_ids) | set(self.eos_token_ids)
        self.filler_ids = sorted({t for w in self.word_ids for t in w} - special)
        self.word_cycle = [t for w in self.word_ids for t in w]

    # -- the script
    def _rng(self, job: Job) -> random.Random:
        h = hashlib.sha256()
        seed = job.params.sampling_seed if self.deterministic else None  # ignored, as SGLang does
        h.update(json.dumps([job.input_ids, seed]).encode())
        return random.Random(int.from_bytes(h.digest()[:8], "big"))

    def _long_words(self, rng: random.Random, n: int) -> list[int]:
        """About `n` tokens of reasoning words (whole words from the cycle, sliced in C)."""
        cycle = self.word_cycle
        start = rng.randrange(len(cycle))
        repeats = (start + n) // len(cycle) + 1
        return (cycle * repeats)[start : start + n]

    def _words(self, rng: random.Random, n: int) -> list[int]:
        out: list[int] = []
        start = rng.randrange(len(self.word_ids))
        for k in range(n):
            out.extend(self.word_ids[(start + k) % len(self.word_ids)])
        return out

    def _tool_section(self, rng: random.Random, prompt_text: str) -> list[int] | None:
        names = re.findall(r'"name"\s*:\s*"([A-Za-z0-9_\-\.]+)"', prompt_text)
        name = names[0] if names else "get_weather"
        args = json.dumps({"city": rng.choice(["Paris", "Berlin", "Tokyo"])})
        k = self.kimi_tool
        if all(v is not None for v in k.values()) and "tool_declare" in prompt_text:
            return (
                [k["<|tool_calls_section_begin|>"], k["<|tool_call_begin|>"]]
                + self.enc(f"functions.{name}:0")
                + [k["<|tool_call_argument_begin|>"]]
                + self.enc(args)
                + [k["<|tool_call_end|>"], k["<|tool_calls_section_end|>"]]
            )
        q = self.qwen_tool
        if all(v is not None for v in q.values()) and "<tools>" in prompt_text:
            body = json.dumps({"name": name, "arguments": json.loads(args)})
            return [q["<tool_call>"]] + self.enc("\n" + body + "\n") + [q["</tool_call>"]]
        return None

    def _answer_length(self, rng: random.Random) -> int:
        """Reasoning tokens of a long answer: uniform in [lo, hi], or (`answer_spread` lognormal) a
        long-tailed spread as real answer lengths have, median sqrt(lo * hi), lo and hi two sigmas
        out, clipped to [lo, hi]."""
        lo, hi = self.answer_tokens
        if self.answer_spread != "lognormal" or lo >= hi:
            return rng.randint(lo, hi)
        sigma = math.log(hi / max(lo, 1)) / 4
        return max(lo, min(hi, round(rng.lognormvariate(math.log(math.sqrt(max(lo, 1) * hi)), sigma))))

    def plan(self, job: Job) -> list[int]:
        """The full intended output for `job`, before stopping rules cut or extend it."""
        rng = self._rng(job)
        planned: list[int] = []
        if self.think_id is not None and (not job.input_ids or job.input_ids[-1] != self.think_id):
            planned += [self.think_id] + self.enc("\n")
        kind = "answer"
        u = rng.random()
        if u < self.ramble_rate or self.think_end_id is None:
            kind = "ramble"
        if self.answer_tokens is not None:
            planned += self._long_words(rng, self._answer_length(rng))
        else:
            planned += self._words(rng, rng.randint(4, 40))
        if kind == "ramble":
            return planned  # the stopping loop extends it with filler to max_new_tokens
        planned.append(self.think_end_id)
        tool = None
        if rng.random() < self.tool_rate and (
            self.kimi_tool["<|tool_calls_section_begin|>"] is not None or self.qwen_tool["<tool_call>"] is not None
        ):
            prompt_text = self.tokenizer.decode(job.input_ids[-4096:], skip_special_tokens=False)
            tool = self._tool_section(rng, prompt_text)
        if tool is not None:
            planned += self.enc("Let me check.") + tool
        else:
            planned += self.enc("\n\n") + self._words(rng, rng.randint(2, 20))
        stop = self._preferred_stop(job, rng)
        if stop is not None:
            planned.append(stop)
        return planned

    def _preferred_stop(self, job: Job, rng: random.Random) -> int | None:
        """The id an answer ends on: its turn's end, as a chat model ends a turn — the tokenizer's eos
        where the request stops on it (Qwen3's eos is its turn end <|im_end|>), else the request's
        stop token (Kimi-K2.5 ends a turn with <|im_end|>; its eos is [EOS]). With `eos_rate`, an
        answer ends on the model's eos instead where that differs, as a real answer sometimes does."""
        requested = set(job.params.stop_token_ids)
        candidates = set(self.eos_token_ids) | requested
        if not candidates:
            return None
        eos = self.tokenizer.eos_token_id
        turn_end = eos if eos in candidates and (eos in requested or not requested) else min(requested or candidates)
        if self.eos_rate and eos in self.eos_token_ids and eos != turn_end and rng.random() < self.eos_rate:
            return eos
        return turn_end

    # -- whole answers
    def answer(self, job: Job) -> tuple[list[int], dict[str, Any]]:
        """`job`'s whole output and finish reason, made at once (no pacing, no abort); `job` is untouched."""
        shadow = Job(job.item, max_new_tokens=job.max_new_tokens, on_done=_ignore)
        shadow.state = RUNNING
        self._generate(shadow, pace=False)
        return shadow.output_ids, shadow.finish_reason

    CANNED_ANSWERS_KEPT = 4096

    def canned_answer(self, item: GenerateItem, max_new_tokens: int) -> protocol.PreparedResponse:
        """The canned answer for a request (`canned` mode): the first request's planned output, stopped
        by this request's `max_new_tokens` (after the context clamp) and stopping parameters."""
        p = item.params
        key = (
            max_new_tokens, p.ignore_eos, p.stop_token_ids, p.stop_strs, p.min_new_tokens,
            p.skip_special_tokens, p.spaces_between_special_tokens, p.no_stop_trim,
        )  # fmt: skip
        with self._canned_lock:
            answer = self._canned_answers.get(key)
            if answer is not None:
                return answer
            if self._canned_origin is None:
                self._canned_origin = (list(item.input_ids), p.sampling_seed)
            ids, seed = self._canned_origin
            origin = GenerateItem(0, item.rid, ids, item.sampling_params, dataclasses.replace(p, sampling_seed=seed))
            output_ids, reason = self.answer(Job(origin, max_new_tokens=max_new_tokens, on_done=_ignore))
            text = protocol.decode_output_text(self.tokenizer, output_ids, reason, p)
            answer = protocol.PreparedResponse(text=text, output_ids=output_ids, finish_reason=reason)
            if len(self._canned_answers) >= self.CANNED_ANSWERS_KEPT:
                self._canned_answers.clear()
            self._canned_answers[key] = answer
            return answer

    def _generate(self, job: Job, *, pace: bool = True) -> None:
        params = job.params
        stop_ids = self.stop_ids_for(params)
        banned = protocol.min_new_tokens_banned(self.eos_token_ids, params)
        decode = self.decode_fn(params)
        planned = self.plan(job)
        rng = self._rng(job)
        pos = 0
        if job.max_new_tokens <= 0:
            job.finish(protocol.finish_length(0))
            return
        if self.answer_tokens is not None:
            if len(planned) < job.max_new_tokens:  # a ramble runs on in reasoning words
                planned = planned + self._long_words(rng, job.max_new_tokens - len(planned))
            if decode is None and not params.min_new_tokens:
                self._generate_whole(job, planned, stop_ids)
                return
        while True:
            if job.abort_requested:
                job.finish(protocol.finish_abort())
                return
            if pos < len(planned):
                token = planned[pos]
            else:
                token = rng.choice(self.filler_ids)
            pos += 1
            if len(job.output_ids) < params.min_new_tokens and token in banned:
                token = rng.choice(self.filler_ids)  # the min-new-tokens penalizer's mask
            job.output_ids.append(token)
            reason = protocol.check_finish(
                job.output_ids,
                params=params,
                stop_ids=stop_ids,
                max_new_tokens=job.max_new_tokens,
                decode=decode,
            )
            if reason is not None:
                job.finish(reason)
                return
            if pace and self.token_delay_s > 0:
                time.sleep(self.token_delay_s)

    def _generate_whole(self, job: Job, planned: list[int], stop_ids: frozenset) -> None:
        """The token-wise rules applied to a whole answer at once: the first stop id ends it
        (included), else the budget cuts it."""
        output = planned[: job.max_new_tokens]
        end = next((i for i, t in enumerate(output) if t in stop_ids), None) if stop_ids else None
        if end is not None:
            job.output_ids.extend(output[: end + 1])
            job.finish(protocol.finish_matched_token(output[end]))
        else:
            job.output_ids.extend(output)
            job.finish(protocol.finish_length(len(output)))

    def _work(self) -> None:
        if self.scheduler is not None:
            self._work_scheduled()
            return
        while not self._closing.is_set():
            for job in self._take(block=True, limit=self.max_batch):
                if job.try_start():
                    if job.canned is not None:
                        job.finish_canned()
                    else:
                        self._generate(job)

    # -- the simulated GPU
    def request_flush_cache(self) -> None:
        """Ask the worker to empty the scheduler's prefix cache when it is next idle."""
        self._flush_cache.set()

    def _work_scheduled(self) -> None:
        """Serve through the scheduler: virtual time kept in step with the monotonic clock, each step slept.

        A job is WAITING until the scheduler first admits it (an abort then resolves it at once, as
        SGLang's "Abort in waiting queue"), RUNNING from then on; an abort of a running job ends it
        with the tokens generated so far.
        """
        sched = self.scheduler
        held: dict[Job, tuple[list[int], dict[str, Any], str | None]] = {}
        t0 = time.monotonic()
        self.clock_origin = time.time() - sched.clock
        while not self._closing.is_set():
            arrived = self._take(block=not sched.busy, limit=1 << 30)
            lag = time.monotonic() - t0 - sched.clock
            if lag > 0:
                sched.advance(lag)  # idle time, or time lost to this thread: it passes for the queue too
            for job in arrived:
                self._schedule(job, held)
            for job in [j for j in held if j.state == DONE or j.abort_requested]:
                stats = sched.abort(job)
                output_ids, _, _ = held.pop(job)
                if job.state != DONE and stats is not None:
                    job.output_ids.extend(output_ids[: stats.output_len])
                    job.stats = self._job_stats(stats)
                    job.finish(protocol.finish_abort())
            if self._flush_cache.is_set() and sched.flush_cache():
                self._flush_cache.clear()
            if sched.busy:
                finished, seconds = sched.step()
                for job in sched.last_step.admitted:
                    job.try_start()  # False for a job aborted meanwhile (removed next round) or re-admitted
                ahead = sched.clock - (time.monotonic() - t0)
                if ahead > 0:
                    self._closing.wait(ahead)
                elif seconds == 0 and not finished:
                    time.sleep(0.001)  # nothing could run this round
                for stats in finished:
                    self._finish_scheduled(stats, held)
            self.load_snapshot = sched.load(timestamp=time.time())
        for job in held:
            job.finish(protocol.finish_abort("Server is shutting down", 503))

    def _schedule(self, job: Job, held: dict) -> None:
        if job.state != WAITING:
            return
        if job.max_new_tokens <= 0:
            if job.try_start():
                job.finish(protocol.finish_length(0))
            return
        if job.canned is not None:
            answer = job.canned
            held[job] = (list(answer.output_ids), dict(answer.finish_reason), answer.text)
        else:
            output_ids, reason = self.answer(job)
            held[job] = (output_ids, reason, None)
        output_ids = held[job][0]
        self.scheduler.add(
            job,
            len(job.input_ids),
            len(output_ids),
            job.max_new_tokens,
            prompt_ids=job.input_ids,
            output_ids=output_ids,
            ignore_eos=job.params.ignore_eos,
        )

    def _job_stats(self, stats: RequestStats) -> dict[str, Any]:
        origin = self.clock_origin
        return {
            "num_retractions": stats.num_retractions,
            "cached_tokens": stats.cached_tokens,
            "queue_time": stats.queue_time,
            "forward_entry_ts": 0.0 if stats.forward_entry_time is None else origin + stats.forward_entry_time,
            "prefill_finished_ts": 0.0 if stats.prefill_finished_time is None else origin + stats.prefill_finished_time,
        }

    def _finish_scheduled(self, stats: RequestStats, held: dict) -> None:
        job: Job = stats.key
        output_ids, reason, text = held.pop(job)
        if job.state == DONE:  # aborted while waiting, and already answered so
            return
        if stats.error is not None:
            job.try_start()
            err_type = "BadRequestError" if stats.status_code == 400 else None
            job.finish(protocol.finish_abort(stats.error, stats.status_code, err_type))
            return
        job.output_ids.extend(output_ids)
        job.text = text
        job.stats = self._job_stats(stats)
        job.finish(reason)


# =============================================================================================
# Model backend


class _Row:
    __slots__ = ("job", "logits", "seq_len", "generator", "stop_ids", "banned", "decode", "counts")

    def __init__(self, job: Job, logits, seq_len: int, generator, stop_ids, banned, decode):
        self.job = job
        self.logits = logits
        self.seq_len = seq_len
        self.generator = generator
        self.stop_ids = stop_ids
        self.banned = banned
        self.decode = decode
        self.counts: dict[int, int] = {}


class ModelBackend(Backend):
    """A transformers causal LM on CPU, serving many requests at once.

    Each new request is prefilled alone, then its KV cache is joined to the running batch; one
    forward pass per step decodes every running row. Rows sit left-padded in a shared cache with an
    attention mask and explicit position ids, so padding never changes a row's result; a row leaves
    the batch as soon as it finishes. Sampling is per row: greedy when top_k == 1 (SGLang's
    temperature < 1e-6 rule), else temperature/top-k/top-p/min-p with a per-request
    `torch.Generator` seeded from `sampling_seed` (a fresh random seed without one). Frequency,
    presence and repetition penalties apply to the tokens generated so far.
    """

    name = "model"

    def __init__(
        self,
        model_dir: Path,
        *,
        tokenizer_dir: Path | None = None,
        max_batch: int = 16,
        num_threads: int = 1,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        deterministic: bool = False,
    ):
        super().__init__(max_batch=max_batch, deterministic=deterministic)
        self.trust_remote_code = trust_remote_code
        self.model_dir = Path(model_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.model_dir
        self.num_threads = num_threads
        self.dtype = dtype
        self.model: Any = None
        self.tokens_generated = 0

    def load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(self.num_threads)
        self.tokenizer = load_tokenizer(self.tokenizer_dir, self.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=getattr(torch, self.dtype))
        model.eval()
        self.model = model
        cfg = _read_config(self.model_dir)
        self.model_type = cfg.get("model_type")
        self.architectures = cfg.get("architectures")
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = protocol.read_eos_token_ids(
            self.model_dir, self.tokenizer.eos_token_id, self.tokenizer.get_added_vocab()
        )

    # -- cache surgery
    @staticmethod
    def _kv(cache) -> list[tuple]:
        return [(layer.keys, layer.values) for layer in cache.layers]

    @staticmethod
    def _cache(kv: list[tuple]):
        from transformers import DynamicCache

        return DynamicCache(ddp_cache_data=kv)

    @staticmethod
    def _left_pad(t, length: int, dim: int):
        import torch

        missing = length - t.shape[dim]
        if missing <= 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    def _join(self, batch_kv, batch_mask, new_kv, new_mask):
        import torch

        if batch_kv is None:
            return new_kv, new_mask
        length = max(batch_mask.shape[1], new_mask.shape[1])
        kv = []
        for (bk, bv), (nk, nv) in zip(batch_kv, new_kv):
            kv.append(
                (
                    torch.cat([self._left_pad(bk, length, 2), self._left_pad(nk, length, 2)], 0),
                    torch.cat([self._left_pad(bv, length, 2), self._left_pad(nv, length, 2)], 0),
                )
            )
        mask = torch.cat([self._left_pad(batch_mask, length, 1), self._left_pad(new_mask, length, 1)], 0)
        return kv, mask

    @staticmethod
    def _select(kv, mask, keep: list[int]):
        import torch

        idx = torch.tensor(keep, dtype=torch.long)
        mask = mask.index_select(0, idx)
        # Drop leading columns that are padding in every remaining row.
        real = mask.any(dim=0).nonzero()
        first = int(real[0]) if real.numel() else 0
        mask = mask[:, first:]
        kv = [(k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in kv]
        return kv, mask

    # -- sampling
    def _next_token(self, row: _Row) -> int:
        import torch

        job, params = row.job, row.job.params
        logits = row.logits.float().clone()
        if params.logit_bias:
            for k, v in params.logit_bias.items():
                logits[int(k)] += float(v)
        if row.counts and (params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0):
            ids = torch.tensor(list(row.counts), dtype=torch.long)
            cnt = torch.tensor(list(row.counts.values()), dtype=logits.dtype)
            sel = logits[ids]
            if params.repetition_penalty != 1.0:
                rp = params.repetition_penalty
                sel = torch.where(sel > 0, sel / rp, sel * rp)
            sel = sel - params.frequency_penalty * cnt - params.presence_penalty
            logits[ids] = sel
        if len(job.output_ids) < params.min_new_tokens and row.banned:
            banned = [t for t in row.banned if 0 <= t < logits.shape[0]]
            logits[banned] = float("-inf")
        if params.greedy:
            return int(torch.argmax(logits))
        logits = logits / params.temperature
        probs = torch.softmax(logits, dim=-1)
        if params.top_k < probs.shape[0]:
            kth = torch.topk(probs, params.top_k).values[-1]
            probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, 0)
            drop = (cum - sorted_p) > params.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        if params.min_p > 0.0:
            probs = torch.where(probs < params.min_p * probs.max(), torch.zeros_like(probs), probs)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=row.generator))

    def _prefill(self, job: Job):
        import torch
        from transformers import DynamicCache

        ids = torch.tensor([job.input_ids], dtype=torch.long)
        cache = DynamicCache()
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        gen = torch.Generator()
        seed = job.params.sampling_seed if self.deterministic else None  # ignored, as SGLang does
        gen.manual_seed(seed % (1 << 63) if seed is not None else random.getrandbits(63))
        row = _Row(
            job,
            out.logits[0, -1],
            len(job.input_ids),
            gen,
            self.stop_ids_for(job.params),
            protocol.min_new_tokens_banned(self.eos_token_ids, job.params),
            self.decode_fn(job.params),
        )
        mask = torch.ones((1, len(job.input_ids)), dtype=torch.long)
        return row, self._kv(out.cache), mask

    def _work(self) -> None:
        import torch

        torch.set_num_threads(self.num_threads)
        rows: list[_Row] = []
        kv = None
        mask = None
        with torch.inference_mode():
            while not self._closing.is_set():
                # Admit what is queued, up to the batch limit.
                for job in self._take(block=not rows, limit=self.max_batch - len(rows)):
                    if not job.try_start():
                        continue
                    if job.max_new_tokens <= 0:
                        job.finish(protocol.finish_length(0))
                        continue
                    try:
                        row, new_kv, new_mask = self._prefill(job)
                    except Exception as e:  # a bad prompt must not take the worker down
                        log.exception("prefill failed for %s", job.rid)
                        job.finish(protocol.finish_abort(str(e), 500, "InternalServerError"))
                        continue
                    kv, mask = self._join(kv, mask, new_kv, new_mask)
                    rows.append(row)
                if not rows:
                    continue
                # Sample one token per row; finished rows leave the batch.
                keep: list[int] = []
                for i, row in enumerate(rows):
                    job = row.job
                    if job.abort_requested:
                        job.finish(protocol.finish_abort())
                        continue
                    token = self._next_token(row)
                    job.output_ids.append(token)
                    row.counts[token] = row.counts.get(token, 0) + 1
                    self.tokens_generated += 1
                    reason = protocol.check_finish(
                        job.output_ids,
                        params=job.params,
                        stop_ids=row.stop_ids,
                        max_new_tokens=job.max_new_tokens,
                        decode=row.decode,
                    )
                    if reason is not None:
                        job.finish(reason)
                    else:
                        keep.append(i)
                if len(keep) != len(rows):
                    rows = [rows[i] for i in keep]
                    if not rows:
                        kv, mask = None, None
                        continue
                    kv, mask = self._select(kv, mask, keep)
                # One forward pass for every running row.
                ids = torch.tensor([[r.job.output_ids[-1]] for r in rows], dtype=torch.long)
                pos = torch.tensor([[r.seq_len] for r in rows], dtype=torch.long)
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype)], dim=1)
                cache = self._cache(kv)
                out = self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                kv = self._kv(out.cache)
                for i, r in enumerate(rows):
                    r.logits = out.logits[i, -1]
                    r.seq_len += 1
        for r in rows:
            r.job.finish(protocol.finish_abort("Server is shutting down", 503))
