"""A simulated GPU: SGLang 0.5.23's scheduler in virtual time, as pure objects (no threads, no clock).

`scheduler.KVScheduler` models what decides a request's latency on a real server: how many
requests run at once, the KV-cache budget, the admission estimate, retraction when decode runs out
of KV, and the prefix cache. Each `step()` is one forward pass and returns the requests it finished
and the pass's duration; the caller advances time (the local engine sleeps that long, a test just
counts).

- `step_model`: the duration of a forward pass (`StepModel`).
- `request_state`: a request as the scheduler tracks it, and what it reports (`RequestStats`, `StepInfo`).
- `kv_pool`: the KV-cache pool and its prefix cache (`KVPool`).
- `metrics`: the numbers a rank's `/v1/loads` entry reports (`LoadMetrics`).
- `admission`: which waiting requests the next prefill takes (`select_prefill_batch`).
- `scheduler`: admission, prefill, decode and retraction (`KVScheduler`).

Modules here import nothing of the engine but each other (in that order: a module imports only the
ones listed before it).
"""
