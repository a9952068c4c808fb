"""The gate as the export applies it: each generated row's flags, the policy's verdict (a quarantined
row becomes a `filtered` record), and the tallies of the flags of the rows kept in the dataset."""

from collections import Counter

from eagle3_datagen.quality.flags import CODES, Flag, QualityFacts, QualitySettings, row_flags


class Gate:
    def __init__(self, settings: QualitySettings, facts: QualityFacts):
        self.settings = settings
        self.facts = facts
        self.kept: Counter = Counter()  # (code, turn, mode) -> rows kept in the dataset with that flag

    @classmethod
    def from_provenance(cls, quality: dict | None, provenance: dict) -> "Gate":
        """From the config's `quality` and a generations table's provenance (its `prompts` facts)."""
        return cls(QualitySettings.from_config(quality), QualityFacts.from_token_facts(provenance.get("prompts") or {}))

    def judge(self, row: dict) -> tuple[list[Flag], Flag | None]:
        """(the row's flags, the first one its policy quarantines, or None)."""
        flags = row_flags(row["prompt_ids"], row["output_ids"], row["finish_type"], self.facts, self.settings.loop)
        return flags, self.settings.quarantined(flags)

    def stats(self) -> dict:
        """What the dataset's provenance records: the gate's settings and the kept rows' flags, per
        code and turn (`kept_flags`), and per mode, code and turn (`kept_flags_by_mode`)."""
        kept = {code: {} for code in CODES}
        by_mode: dict[str, dict] = {}
        for (code, turn, mode), n in sorted(self.kept.items()):
            kept[code][str(turn)] = kept[code].get(str(turn), 0) + n
            by_mode.setdefault(mode, {c: {} for c in CODES})[code][str(turn)] = n
        return {"settings": self.settings.to_json(), "kept_flags": kept, "kept_flags_by_mode": by_mode}


def reason_of(flag: Flag) -> str:
    """A filtered record's reason for a quarantined flag: its code, what was found, the policy."""
    return f"{flag.code}: {flag.detail} (quality.policies.{flag.code}: quarantine)"
