"""The demo's own parts, built from packages with no hub access: the Qwen3 tokenizer directory, the
Kimi-K2.5-shaped tokenizers (fast and TikToken, as the real files are), and the tiny model trained on
CPU that the local engine serves.

Imports `settings`, `storage` and `tokens`.
"""
