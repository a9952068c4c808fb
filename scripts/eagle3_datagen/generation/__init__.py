"""Generation: talking to SGLang exactly once per row. What a request is and its fingerprint
(`requests`), the HTTP client and what paces it (`client`, `pacing`, `answers`), what a server says
of itself and its load (`server_info`, `load`), the journal that makes reruns resume, the shard lock,
the servers a job launches and watches (`servers`, `watchdog`) and what stops one starting
(`startup`), a conversation's later turns (`turns`), the plan of a shard (`planning`), a shard's run through its servers (`run`), the rows a
job assembles (`assemble`), and the pilot's projection of a full run (`projection`).

Imports `settings`, `storage`, `tokens` and `quality`.
"""
