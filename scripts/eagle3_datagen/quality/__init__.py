"""The quality gate: what each generated row is worth for training, read from its ids, never from
decoded text (`loops`: repetition loops; `flags`: reason codes; `gate`: the policies; `audit`:
trainer rows made elsewhere)."""
