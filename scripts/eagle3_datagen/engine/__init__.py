"""The `local` engine: a CPU stand-in that speaks SGLang's native HTTP API as the client uses it.

- `protocol`: the wire format as pure functions; `capacity`: a simulated GPU in virtual time.
- `jobs`, `loops`, `script`, `scripted`, `model`: the backends (a transformers model, or a scripted
  stand-in for tests and benchmarks) and the repetition loops they can be made to fall into.
- `server`, `app`: the aiohttp app (`app.create_app`); `__main__`: the command line.

The engine may import only `eagle3_datagen.settings` and its own modules.
"""
