"""The `local` engine: a CPU stand-in that speaks SGLang 0.5.23's native HTTP API.

`protocol` holds the wire format as pure functions, `backends` the token generators (a transformers
model, or a scripted stand-in for tests), `capacity` a simulated GPU scheduler (SGLang's admission,
KV budget, retraction and prefix cache in virtual time) that the scripted backend can run behind,
`loads` the load endpoints' answers, `server` the aiohttp app; run it with
`python -m eagle3_datagen.engine`.
"""
