"""The token domain: the model's chat template and tokenizer (rendering, stop sets, token facts),
SGLang's reasoning and tool-call parsers, and the chat layer that replays what SGLang's OpenAI route
would have done to an answer. Never rebuilds tokens from text on the data path.

Imports `settings` and `storage`.
"""
