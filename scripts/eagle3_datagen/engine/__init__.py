"""The `local` engine: a CPU stand-in that speaks SGLang 0.5.23's native HTTP API.

- `protocol/`: the wire format as pure functions (request parsing, sampling parameters, finish
  rules, answers, error shapes).
- `model_facts`: what is read from a model or tokenizer directory (tokenizer, config, EOS ids).
- `capacity/`: a simulated GPU scheduler (SGLang's admission, KV budget, retraction and prefix
  cache in virtual time) that the scripted backend can run behind.
- `loads`: the load endpoints' answers.
- `backends/`: the token generators (a transformers model, or a scripted stand-in for tests).
- `server/`: the aiohttp app.

Run it with `python -m eagle3_datagen.engine` (`__main__`). The engine may import only
`eagle3_datagen.settings` and its own modules; within it, a module imports only the ones listed
before its own (`protocol`, `model_facts` and `capacity` import none of the others).
"""
