"""The `local` engine: a CPU stand-in that speaks SGLang 0.5.23's native HTTP API.

`protocol` holds the wire format as pure functions, `backends` the token generators (a transformers
model, or a scripted stand-in for tests), `server` the aiohttp app; run it with
`python -m eagle3_datagen.engine`.
"""
