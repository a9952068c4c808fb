"""The token domain: the model's chat template and tokenizer, SGLang's reasoning and tool-call parsers,
and the chat layer they make. Never rebuilds tokens from text on the data path.

Imports `settings` and `storage`.
"""
