"""SGLang 0.5.23's native `/generate` wire format, as pure functions (no aiohttp, no torch).

Everything here mirrors a named place in SGLang's source (paths under `python/sglang/`), so that the
CPU engine answers exactly as a real server would:

- `errors`: the shapes of SGLang's refusals (`http_server._create_error_response` and friends).
- `validation`: FastAPI's refusals before a route runs: how a body is read (Content-Type, JSON) and
  pydantic's errors for the fields of `GenerateReqInput` and `AbortReq` (`http_server.py`).
- `contract`: the 0.5.23 request-schema check (`api/v1/api_types.py`, `srt/entrypoints/api_contract.py`).
- `sampling`: `SamplingParams`, its defaults, greedy rule and `verify()` texts.
- `parsing`: a `/generate` body split into single requests and validated
  (`io_struct.GenerateReqInput.normalize_batch_and_arguments`, `tokenizer_manager._validate_one_request`).
- `finish`: finish reasons and the stopping rules (`schedule_batch.py`, `detokenizer_manager.py`).
- `responses`: the answer and its `meta_info` (`tokenizer_manager._handle_batch_output`).

Modules here import only `eagle3_datagen.settings` and each other (in that order: a module imports
only the ones listed before it). The server and both backends build on them.
"""
