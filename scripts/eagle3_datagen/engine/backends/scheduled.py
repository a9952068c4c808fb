"""The scripted backend's worker loop behind a simulated GPU: its answers, made at once, paced by a
`capacity.scheduler.KVScheduler` whose step times the worker sleeps in real time (`ScheduledWorker`).

Imports `protocol`, `capacity` and `backends.jobs`.
"""

import time
from typing import Any

from eagle3_datagen.engine.backends.jobs import DONE, WAITING, Backend, Job
from eagle3_datagen.engine.capacity.request_state import RequestStats
from eagle3_datagen.engine.protocol.finish import finish_abort, finish_length

# A held job's answer: (output ids, finish reason, text or None to decode).
Held = tuple[list[int], dict[str, Any], str | None]


class ScheduledWorker:
    """Serve a backend's jobs through its scheduler: virtual time kept in step with the monotonic
    clock, each step slept.

    A job is WAITING until the scheduler first admits it (an abort then resolves it at once, as
    SGLang's "Abort in waiting queue"), RUNNING from then on; an abort of a running job ends it
    with the tokens generated so far.

    The backend (the scripted one) provides `scheduler`, `answer(job)`, the `flush_requested` event
    the server sets, and gets `clock_origin` (wall-clock time of the scheduler's virtual 0) and
    `load_snapshot` (the scheduler's `load()` as of its last step) published.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.sched = backend.scheduler
        self.held: dict[Job, Held] = {}
        self._t0 = time.monotonic()

    def run(self) -> None:
        backend, sched = self.backend, self.sched
        self._t0 = time.monotonic()
        backend.clock_origin = time.time() - sched.clock
        while not backend._closing.is_set():
            arrived = backend._take(block=not sched.busy, limit=1 << 30)
            lag = time.monotonic() - self._t0 - sched.clock
            if lag > 0:
                sched.advance(lag)  # idle time, or time lost to this thread: it passes for the queue too
            for job in arrived:
                self._schedule(job)
            self._drop_aborted()
            if backend.flush_requested.is_set() and sched.flush_cache():
                backend.flush_requested.clear()
            if sched.busy:
                self._step()
            backend.load_snapshot = sched.load(timestamp=time.time())
        for job in self.held:
            job.finish(finish_abort("Server is shutting down", 503))

    def _step(self) -> None:
        """One forward pass of the scheduler, slept until the real clock has caught up with it."""
        sched = self.sched
        finished, seconds = sched.step()
        for job in sched.last_step.admitted:
            job.try_start()  # False for a job aborted meanwhile (removed next round) or re-admitted
        ahead = sched.clock - (time.monotonic() - self._t0)
        if ahead > 0:
            self.backend._closing.wait(ahead)
        elif seconds == 0 and not finished:
            time.sleep(0.001)  # nothing could run this round
        for stats in finished:
            self._finish(stats)
        self._stream_progress()

    def _stream_progress(self) -> None:
        """Streamed jobs get the tokens the scheduler has generated for them so far."""
        for job, (output_ids, _, _) in self.held.items():
            if job.watched and job.state != DONE:
                n = min(self.sched.progress(job), len(output_ids))
                if n > len(job.output_ids):
                    job.output_ids.extend(output_ids[len(job.output_ids) : n])
                    job.progressed()

    def _schedule(self, job: Job) -> None:
        if job.state != WAITING:
            return
        if job.max_new_tokens <= 0:
            if job.try_start():
                job.finish(finish_length(0))
            return
        if job.canned is not None:
            answer = job.canned
            self.held[job] = (list(answer.output_ids), dict(answer.finish_reason), answer.text)
        else:
            output_ids, reason = self.backend.answer(job)
            self.held[job] = (output_ids, reason, None)
        output_ids = self.held[job][0]
        self.sched.add(
            job,
            len(job.input_ids),
            len(output_ids),
            job.max_new_tokens,
            prompt_ids=job.input_ids,
            output_ids=output_ids,
            ignore_eos=job.params.ignore_eos,
        )

    def _drop_aborted(self) -> None:
        """Take jobs aborted (or answered) meanwhile out of the scheduler; a running one ends with its
        tokens so far."""
        for job in [j for j in self.held if j.state == DONE or j.abort_requested]:
            stats = self.sched.abort(job)
            output_ids, _, _ = self.held.pop(job)
            if job.state != DONE and stats is not None:
                job.output_ids.extend(output_ids[len(job.output_ids) : stats.output_len])
                job.stats = self._job_stats(stats)
                job.finish(finish_abort())

    def _job_stats(self, stats: RequestStats) -> dict[str, Any]:
        origin = self.backend.clock_origin
        return {
            "num_retractions": stats.num_retractions,
            "cached_tokens": stats.cached_tokens,
            "queue_time": stats.queue_time,
            "forward_entry_ts": 0.0 if stats.forward_entry_time is None else origin + stats.forward_entry_time,
            "prefill_finished_ts": 0.0 if stats.prefill_finished_time is None else origin + stats.prefill_finished_time,
        }

    def _finish(self, stats: RequestStats) -> None:
        job: Job = stats.key
        output_ids, reason, text = self.held.pop(job)
        if job.state == DONE:  # aborted while waiting, and already answered so
            return
        if stats.error is not None:
            job.try_start()
            err_type = "BadRequestError" if stats.status_code == 400 else None
            job.finish(finish_abort(stats.error, stats.status_code, err_type))
            return
        job.output_ids.extend(output_ids[len(job.output_ids) :])
        job.text = text
        job.stats = self._job_stats(stats)
        job.finish(reason)
