"""Whether each mode's prompts end with its `prompt_suffix`, checked as they are tokenized.

A mode's suffix (`model.modes.NAME.prompt_suffix`, else `model.prompt_suffix`) is what its chat template
ends every generation prompt with; later steps read answers as starting after it. A suffix that none of
a mode's first prompts (`FIRST`) ends with is a config error, refused before anything is generated; a
single prompt that ends otherwise (a template can end one conversation differently, a tokenizer can
merge a plain-text suffix into the text before it) is a row error: that row is skipped with its reason.

May import: `settings`, `tokens.vocabulary`.
"""

from collections import Counter

from eagle3_datagen.settings import ModelProfile
from eagle3_datagen.tokens.vocabulary import token_ids


class SuffixMismatch(ValueError):
    """A mode's prompt_suffix is not what its chat template renders."""


class SuffixCheck:
    """Applied to a category's prompt rows a batch at a time, then `finish`ed."""

    FIRST = 8  # conversations of a mode that must not all miss its suffix

    def __init__(self, tokenizer, profile: ModelProfile, modes: tuple[str, ...]):
        self.tokenizer, self.profile = tokenizer, profile
        self.suffixes = {mode: token_ids(tokenizer, profile.for_mode(mode).prompt_suffix) for mode in modes}
        self.seen: Counter = Counter()  # a mode's first usable conversations, up to FIRST
        self.matched: Counter = Counter()
        self.endings: dict[str, list[list[int]]] = {mode: [] for mode in modes}
        self.decided: set[str] = set()

    def apply(self, table: list[dict]) -> None:
        """Skip the usable rows whose prompt does not end with their mode's suffix; raise
        SuffixMismatch once a mode's first FIRST conversations all miss it."""
        for row in table:
            suffix = self.suffixes.get(row["mode"])
            if not suffix or row["status"] != "ok":
                continue
            ends = list(row["prompt_ids"][-len(suffix) :]) == suffix
            mode = row["mode"]
            if row["sample_index"] == 0 and mode not in self.decided:
                self.seen[mode] += 1
                self.matched[mode] += ends
                self.endings[mode].append(list(row["prompt_ids"][-len(suffix) - 6 :]))
                if self.seen[mode] >= self.FIRST:
                    self._decide(mode)
            if not ends:
                row.update(
                    status="skipped",
                    max_new_tokens=0,
                    reason=f"{row['source']}: the prompt ends {self._tokens(row['prompt_ids'][-len(suffix) - 2 :])}, "
                    f"not with mode {mode}'s prompt_suffix {self._tokens(suffix)} as the others do",
                )

    def finish(self) -> None:
        """Decide the modes with fewer than FIRST usable conversations in the whole category."""
        for mode in self.suffixes:
            if mode not in self.decided and self.seen[mode]:
                self._decide(mode)

    def _decide(self, mode: str) -> None:
        self.decided.add(mode)
        if self.matched[mode]:
            return
        endings = self.endings[mode]
        common = endings[0]
        for ending in endings[1:]:
            while common and ending[-len(common) :] != common:
                common = common[1:]
        key, n = self.key(mode), len(endings)
        if n == 1:
            seen = f"the first prompt ends {self._tokens(common)}"
        elif common:
            seen = f"the first {n} all end {self._tokens(common)}"
        else:
            seen = (
                f"the first {n} prompts end as differently as {self._tokens(endings[0])} and {self._tokens(endings[1])}"
            )
        raise SuffixMismatch(
            f"mode {mode}'s prompt_suffix {self._tokens(self.suffixes[mode])} ({key}) is not what the chat template "
            f"ends its prompts with: {seen} (token strings). Set {key} to the tokens the template ends the "
            "generation prompt with in this mode (or change the mode's chat_template_kwargs); nothing was generated"
        )

    def key(self, mode: str) -> str:
        """The config key that gives mode `mode` its suffix."""
        if "prompt_suffix" in (self.profile.modes.get(mode) or {}):
            return f"model.modes.{mode}.prompt_suffix"
        if self.profile.modes:
            return f"model.prompt_suffix (or model.modes.{mode}.prompt_suffix)"
        return "model.prompt_suffix"

    def _tokens(self, ids) -> list[str]:
        return list(self.tokenizer.convert_ids_to_tokens(list(ids)))
