"""The quality gate: what each generated row is worth for training, read from its output ids.

`loops` finds an output that ends in one n-gram repeated many times, after the fact and while it is
generated; `flags` gives each row its reason codes (`repetition_loop`, `unfinished_reasoning`,
`stopped_in_reasoning`, `empty_answer`, `unexpected_stop`) from its ids and the tokenizer's facts, never from decoded text.
"""
