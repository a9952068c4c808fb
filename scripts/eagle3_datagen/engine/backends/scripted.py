"""The scripted backend: no model; `script.AnswerScript`'s answers, produced at once (or at a
configured pace per token, so that aborts find them running), canned, or paced by a simulated GPU.

Imports `protocol`, `model_facts`, `capacity` and `backends.jobs`, `.loops`, `.script`, `.scheduled`.
"""

import dataclasses
import random
import threading
import time
from pathlib import Path
from typing import Any

from eagle3_datagen.engine.backends.jobs import RUNNING, Backend, Job, ignore_done
from eagle3_datagen.engine.backends.loops import LoopPlan
from eagle3_datagen.engine.backends.scheduled import ScheduledWorker
from eagle3_datagen.engine.backends.script import AnswerScript
from eagle3_datagen.engine.capacity.scheduler import KVScheduler
from eagle3_datagen.engine.model_facts import load_tokenizer, read_config, read_eos_token_ids
from eagle3_datagen.engine.protocol.finish import (
    check_finish,
    finish_abort,
    finish_length,
    finish_matched_token,
    min_new_tokens_banned,
)
from eagle3_datagen.engine.protocol.parsing import GenerateItem
from eagle3_datagen.engine.protocol.responses import PreparedResponse, decode_output_text


class ScriptedBackend(Backend):
    """Deterministic, instant outputs shaped like a reasoning model's, from a tokenizer alone.

    The answers are `AnswerScript`'s (see there). Stopping, `min_new_tokens`, `ignore_eos`,
    `stop_token_ids` and stop strings follow the same rules as the model backend; a ramble runs to
    `max_new_tokens` (finish length).

    `answer_tokens=(lo, hi)` makes answers long, as a thinking model's are: the reasoning runs to a
    length drawn uniformly from [lo, hi] tokens per request (scale benchmarks). Such answers are
    made whole rather than token by token where no stop string or min_new_tokens asks for the
    token-wise rules, so that a CPU serves hundreds of millions of tokens.

    `canned=True` is a speed mode for benchmarking clients: the answer is planned once, from the
    first request's prompt, and every request gets it (`canned_answer`), cut by its own
    `max_new_tokens` and stopping parameters under the same rules; one prepared answer per
    distinct set of those. The server then answers without the worker thread where it can, from
    the answer's pre-serialized bytes. `token_delay_s` does not apply to canned answers.

    With a `capacity.scheduler.KVScheduler` it behaves like a GPU of that capacity instead: every
    answer is made at once, then paced by the simulated scheduler (`scheduled.ScheduledWorker`).
    """

    name = "scripted"
    CANNED_ANSWERS_KEPT = 4096

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
        self.flush_requested = threading.Event()  # set by the server, cleared by the worker
        self.trust_remote_code = trust_remote_code
        self.answer_tokens = answer_tokens
        self.answer_spread = answer_spread
        self.canned = canned
        self._canned_origin: tuple[list[int], int | None] | None = None
        self._canned_answers: dict[tuple, PreparedResponse] = {}
        self._canned_lock = threading.Lock()
        self.tokenizer_dir = Path(tokenizer_dir)
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.token_delay_s = token_delay_s
        self.ramble_rate = ramble_rate
        self.tool_rate = tool_rate
        self.eos_rate = eos_rate
        self.script: AnswerScript | None = None

    def load(self) -> None:
        tok = load_tokenizer(self.tokenizer_dir, self.trust_remote_code)
        self.tokenizer = tok
        self.vocab_size = len(tok)
        cfg = read_config(self.model_dir)
        self.model_type = cfg.get("model_type")
        self.architectures = cfg.get("architectures")
        self.eos_token_ids = read_eos_token_ids(
            self.model_dir if self.model_dir is not None else self.tokenizer_dir,
            tok.eos_token_id,
            tok.get_added_vocab(),
        )
        self.script = AnswerScript(
            tok,
            self.eos_token_ids,
            deterministic=self.deterministic,
            ramble_rate=self.ramble_rate,
            tool_rate=self.tool_rate,
            eos_rate=self.eos_rate,
            answer_tokens=self.answer_tokens,
            answer_spread=self.answer_spread,
        )

    # -- whole answers
    def answer(self, job: Job) -> tuple[list[int], dict[str, Any]]:
        """`job`'s whole output and finish reason, made at once (no pacing, no abort); `job` is untouched."""
        shadow = Job(job.item, max_new_tokens=job.max_new_tokens, on_done=ignore_done)
        shadow.loop = job.loop
        shadow.state = RUNNING
        self._generate(shadow, pace=False)
        return shadow.output_ids, shadow.finish_reason

    def canned_answer(self, item: GenerateItem, max_new_tokens: int, loop: LoopPlan | None = None) -> PreparedResponse:
        """The canned answer for a request (`canned` mode): the first request's planned output, stopped
        by this request's `max_new_tokens` (after the context clamp) and stopping parameters; with a
        `loop`, that answer turned into the loop (not kept)."""
        if loop is not None:
            return self._canned_loop(item, max_new_tokens, loop)
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
            output_ids, reason = self.answer(Job(origin, max_new_tokens=max_new_tokens, on_done=ignore_done))
            text = decode_output_text(self.tokenizer, output_ids, reason, p)
            answer = PreparedResponse(text=text, output_ids=output_ids, finish_reason=reason)
            if len(self._canned_answers) >= self.CANNED_ANSWERS_KEPT:
                self._canned_answers.clear()
            self._canned_answers[key] = answer
            return answer

    def _canned_loop(self, item: GenerateItem, max_new_tokens: int, loop: LoopPlan) -> PreparedResponse:
        base = self.canned_answer(item, max_new_tokens)
        p = item.params
        rng = random.Random(loop.onset * 7919 + loop.period)
        stops = self.stop_ids_for(p) | min_new_tokens_banned(self.eos_token_ids, p)
        output_ids = loop.apply(base.output_ids, max_new_tokens, stops, lambda: self.script.filler(rng))
        reason = finish_length(len(output_ids))
        text = decode_output_text(self.tokenizer, output_ids, reason, p)
        return PreparedResponse(text=text, output_ids=output_ids, finish_reason=reason)

    def _generate(self, job: Job, *, pace: bool = True) -> None:
        params = job.params
        stop_ids = self.stop_ids_for(params)
        banned = min_new_tokens_banned(self.eos_token_ids, params)
        decode = self.decode_fn(params)
        script = self.script
        planned = script.plan(job)
        rng = script.rng(job)
        pos = 0
        if job.max_new_tokens <= 0:
            job.finish(finish_length(0))
            return
        if job.loop is not None:  # never a stop id: it runs to max_new_tokens
            planned = job.loop.apply(planned, job.max_new_tokens, stop_ids | banned, lambda: script.filler(rng))
        paced = pace and self.token_delay_s > 0
        if self.answer_tokens is not None:
            if len(planned) < job.max_new_tokens:  # a ramble runs on in reasoning words
                planned = planned + script.long_words(rng, job.max_new_tokens - len(planned))
            if decode is None and not params.min_new_tokens and not paced:
                self._generate_whole(job, planned, stop_ids)
                return
        while True:
            if job.abort_requested:
                job.finish(finish_abort())
                return
            if pos < len(planned):
                token = planned[pos]
            else:
                token = script.filler(rng)
            pos += 1
            if len(job.output_ids) < params.min_new_tokens and token in banned:
                token = script.filler(rng)  # the min-new-tokens penalizer's mask
            job.output_ids.append(token)
            reason = check_finish(
                job.output_ids,
                params=params,
                stop_ids=stop_ids,
                max_new_tokens=job.max_new_tokens,
                decode=decode,
            )
            if reason is not None:
                job.finish(reason)
                return
            job.progressed()
            if paced:
                time.sleep(self.token_delay_s)

    def _generate_whole(self, job: Job, planned: list[int], stop_ids: frozenset) -> None:
        """The token-wise rules applied to a whole answer at once: the first stop id ends it
        (included), else the budget cuts it."""
        output = planned[: job.max_new_tokens]
        end = next((i for i, t in enumerate(output) if t in stop_ids), None) if stop_ids else None
        if end is not None:
            job.output_ids.extend(output[: end + 1])
            job.finish(finish_matched_token(output[end]))
        else:
            job.output_ids.extend(output)
            job.finish(finish_length(len(output)))

    def _work(self) -> None:
        if self.scheduler is not None:
            ScheduledWorker(self).run()
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
        self.flush_requested.set()
