"""Generation: talking to SGLang exactly once per row. What a request is and its fingerprint
(`requests`), the HTTP client and what paces it (`client`, `pacing`, `answers`), what a server says
of itself and its load (`server_info`, `load`), the journal that makes reruns resume, the shard lock,
the servers a job launches and watches (`servers`, `watchdog`) and what stops one starting (`startup`), a conversation's later turns
(`turns`), and the rows a job assembles (`assemble`).

Imports `settings`, `storage` and `tokens`.
"""
