"""The `local` engine: a CPU stand-in that speaks SGLang's native HTTP API as the client uses it
(`python -m eagle3_datagen.engine`; the app: `app.create_app`). Its backends: a transformers model
(`model`) or a scripted stand-in for tests and benchmarks (`scripted`, `script`). The engine may
import only `eagle3_datagen.settings` and its own modules.
"""
