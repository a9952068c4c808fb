"""An aiohttp app that answers SGLang 0.5.23's native HTTP API from a local backend.

Routes: `POST|PUT /generate`, `GET /health`, `GET /health_generate`, `GET /get_server_info`,
`GET /server_info`, `GET /get_model_info`, `GET /model_info`, `POST /abort_request`,
`GET|POST /flush_cache`, `GET /v1/loads`, and `GET /get_load` when acting as a version before
0.5.23 (0.5.23's http_server.py has no such route: 404 there). Answers and error bodies follow
`protocol` and `loads`; see their docstrings for the SGLang source each one mirrors.

- `http_io`: reading a JSON body, writing a JSON answer, noticing a client that went away.
- `faults`: injected latency and failures for tests (`Faults`), every draw from one seeded RNG.
- `state`: `EngineServer`, the state behind the routes (backend, requests in flight, the record).
- `generate`: the `/generate` route.
- `info`: health, server and model info, abort and flush-cache routes.
- `load_routes`: `/v1/loads` and `/get_load`.
- `app`: `create_app`, the routes wired to an `EngineServer`.

Modules here import `protocol`, `loads`, `backends`, `settings` and each other (in that order: a
module imports only the ones listed before it).
"""
