"""Token generators behind the local engine: a transformers model on CPU, or a scripted stand-in.

Both take `jobs.Job`s from any thread (`submit`) and run them on one worker thread of their own. A
job reports back through its `on_done` callback, from the worker thread. Stopping follows
`protocol.finish.check_finish` in both, so the two backends agree on every finish rule.

- `jobs`: `Job` (one request's state, abort and finish) and `Backend`, the worker-thread queue both share.
- `model`: `ModelBackend`, continuous batching of a transformers causal LM.
- `script`: `AnswerScript`, the deterministic reasoning-shaped answers of the scripted backend.
- `scheduled`: the scripted backend's serving through a `capacity` scheduler (a simulated GPU).
- `scripted`: `ScriptedBackend`, those answers produced at once, paced per token, canned, or scheduled.

Modules here import `protocol`, `model_facts`, `capacity` and each other (only the ones listed
before their own), never `server`.
"""
