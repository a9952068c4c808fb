"""The scripted backend: no model; `script.AnswerScript`'s answers, produced at once (or at a set pace
per token, so that aborts find them running), or paced by a simulated GPU (`ScheduledWorker`).
Imports `protocol`, `capacity`, `jobs` and `script`.
"""

import time
from collections import deque
from pathlib import Path
from typing import Any

from eagle3_datagen.engine.capacity import KVScheduler
from eagle3_datagen.engine.jobs import DONE, RUNNING, WAITING, Backend, Job
from eagle3_datagen.engine.protocol import check_finish, finish_abort, finish_length, stop_sets
from eagle3_datagen.engine.script import AnswerScript


class ScriptedBackend(Backend):
    """`AnswerScript`'s outputs under the model backend's stopping rules. Long answers (`answer_tokens`)
    are made whole where no min_new_tokens needs the token-wise rules, as is every answer paced by a
    `capacity.KVScheduler`."""

    name = "scripted"

    def __init__(self, tokenizer_dir: Path, *, model_dir: Path | None = None, token_delay_s: float = 0.0,
                 max_batch: int = 16, ramble_rate: float = 0.15, tool_rate: float = 0.5, eos_rate: float = 0.0,
                 trust_remote_code: bool = False, deterministic: bool = False,
                 answer_tokens: tuple[int, int] | None = None, answer_spread: str = "uniform",
                 scheduler: KVScheduler | None = None):  # fmt: skip
        super().__init__(max_batch=max_batch, deterministic=deterministic)
        self.scheduler, self.trust_remote_code, self.token_delay_s = scheduler, trust_remote_code, token_delay_s
        # The scheduler's `load()` as of its last step, published by the worker for `/v1/loads`.
        self.load_snapshot: dict[str, Any] | None = scheduler.load() if scheduler is not None else None
        self.tokenizer_dir, self.model_dir = Path(tokenizer_dir), Path(model_dir) if model_dir else None
        self.script_options = dict(ramble_rate=ramble_rate, tool_rate=tool_rate, eos_rate=eos_rate,
                                   answer_tokens=answer_tokens, answer_spread=answer_spread)  # fmt: skip
        self.answer_tokens, self.script = answer_tokens, None
        # Recent answers as (input ids, planned output): a request whose input is one of them and a
        # prefix of its output gets the rest, as a model continues its own partial answer.
        self.made: deque = deque(maxlen=64)

    def load(self) -> None:
        self.load_facts(self.model_dir, self.tokenizer_dir)
        self.script = AnswerScript(self.tokenizer, self.eos_token_ids, deterministic=self.deterministic,
                                   **self.script_options)  # fmt: skip

    def answer(self, job: Job) -> tuple[list[int], dict[str, Any]]:
        """`job`'s whole output and finish reason, made at once (no pacing, no abort); `job` is untouched."""
        shadow = Job(job.item, max_new_tokens=job.max_new_tokens, on_done=lambda job: None)
        shadow.loop, shadow.state = job.loop, RUNNING
        self._generate(shadow, pace=False)
        return shadow.output_ids, shadow.finish_reason

    def _generate(self, job: Job, *, pace: bool = True) -> None:
        params, script = job.params, self.script
        stop_ids, banned = stop_sets(self.eos_token_ids, params)
        rest = self._rest(job.input_ids)
        planned = script.plan(job) if rest is None else rest
        rng = script.rng(job)
        filler = lambda: rng.choice(script.filler_ids)  # noqa: E731  a word token that is no special id
        if job.max_new_tokens <= 0:
            job.finish(finish_length(0))
            return
        if job.loop is not None:  # never a stop id: it runs to max_new_tokens
            planned = job.loop.apply(planned, job.max_new_tokens, stop_ids | banned, filler)
        paced = pace and self.token_delay_s > 0
        if self.answer_tokens is not None and len(planned) < job.max_new_tokens:  # a ramble runs on in words
            planned = planned + script.long_words(rng, job.max_new_tokens - len(planned))
        if rest is None:
            self.made.append((list(job.input_ids), planned))
        if self.answer_tokens is not None and not params.min_new_tokens and not paced:
            self._generate_whole(job, planned, stop_ids)
            return
        pos = 0
        while True:
            if job.abort_requested:
                job.finish(finish_abort())
                return
            token = planned[pos] if pos < len(planned) else filler()
            pos += 1
            if len(job.output_ids) < params.min_new_tokens and token in banned:
                token = filler()  # the min-new-tokens mask
            job.output_ids.append(token)
            reason = check_finish(job.output_ids, stop_ids=stop_ids, max_new_tokens=job.max_new_tokens)
            if reason is not None:
                job.finish(reason)
                return
            job.progressed()
            if paced:
                time.sleep(self.token_delay_s)

    def _rest(self, input_ids: list[int]) -> list[int] | None:
        """The rest of a recent answer whose prompt and partial output `input_ids` are, or None."""
        for prompt, planned in reversed(self.made):
            n = len(input_ids) - len(prompt)
            if 0 < n < len(planned) and input_ids[len(prompt) - 1] == prompt[-1] and input_ids[-1] == planned[n - 1]:
                if input_ids[: len(prompt)] == prompt and input_ids[len(prompt) :] == planned[:n]:
                    return planned[n:]
        return None

    def _generate_whole(self, job: Job, planned: list[int], stop_ids: frozenset) -> None:
        """The token-wise rules on a whole answer at once: the first stop id ends it, else the budget."""
        output = planned[: job.max_new_tokens]
        end = next((i for i, t in enumerate(output) if t in stop_ids), None) if stop_ids else None
        job.output_ids.extend(output if end is None else output[: end + 1])
        job.finish(finish_length(len(output)) if end is None else {"type": "stop", "matched": output[end]})

    def _work(self) -> None:
        if self.scheduler is not None:
            return ScheduledWorker(self).run()
        while not self._closing.is_set():
            for job in self._take(block=True, limit=self.max_batch):
                if job.try_start():
                    self._generate(job)


class ScheduledWorker:
    """The scripted backend's jobs served through its scheduler, virtual time kept in step with the
    monotonic clock (each step slept); a job runs from its first admission on."""

    def __init__(self, backend: ScriptedBackend):
        self.backend, self.sched = backend, backend.scheduler
        self.held: dict[Job, tuple[list[int], dict]] = {}  # each job's whole answer
        self._t0 = 0.0  # the monotonic clock's reading at the scheduler's virtual 0

    def run(self) -> None:
        backend, sched = self.backend, self.sched
        self._t0 = time.monotonic() - sched.clock
        while not backend._closing.is_set():
            arrived = backend._take(block=not sched.busy, limit=1 << 30)
            lag = time.monotonic() - self._t0 - sched.clock
            if lag > 0:
                sched.clock += lag  # idle time, or time lost to this thread: it passes for the queue too
            for job in arrived:
                self._schedule(job)
            self._drop_aborted()
            if sched.busy:
                self._step()
            backend.load_snapshot = sched.load(timestamp=time.time())
        for job in self.held:
            job.finish(finish_abort("Server is shutting down", 503))

    def _step(self) -> None:
        sched = self.sched
        finished, seconds = sched.step()
        for job in sched.admitted:
            job.try_start()
        ahead = sched.clock - (time.monotonic() - self._t0)
        if ahead > 0:
            self.backend._closing.wait(ahead)
        elif seconds == 0 and not finished:
            time.sleep(0.001)  # nothing could run this round
        for stats in finished:
            self._finish(stats)
        for job, (output_ids, _) in self.held.items():  # streamed jobs get their tokens so far
            n = min(sched.progress(job), len(output_ids))
            if job._notify is not None and job.state != DONE and n > len(job.output_ids):
                job.output_ids.extend(output_ids[len(job.output_ids) : n])
                job.progressed()

    def _schedule(self, job: Job) -> None:
        if job.state != WAITING:
            return
        if job.max_new_tokens <= 0:
            if job.try_start():
                job.finish(finish_length(0))
            return
        self.held[job] = self.backend.answer(job)
        self.sched.add(job, len(job.input_ids), len(self.held[job][0]), job.max_new_tokens)

    def _drop_aborted(self) -> None:
        for job in [j for j in self.held if j.state == DONE or j.abort_requested]:
            stats = self.sched.abort(job)
            output_ids, _ = self.held.pop(job)
            if job.state != DONE and stats is not None:
                job.output_ids.extend(output_ids[len(job.output_ids) : stats.output_len])
                job.stats = {"num_retractions": stats.num_retractions, "queue_time": stats.queue_time}
                job.finish(finish_abort())

    def _finish(self, stats) -> None:
        job: Job = stats.key
        output_ids, reason = self.held.pop(job)
        if job.state == DONE:  # aborted while waiting, and already answered so
            return
        if stats.error is not None:
            job.try_start()
            job.finish(finish_abort(stats.error, stats.status_code))
            return
        job.output_ids.extend(output_ids[len(job.output_ids) :])
        job.stats = {"num_retractions": stats.num_retractions, "queue_time": stats.queue_time}
        job.finish(dict(reason))
