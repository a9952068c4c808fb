"""Where a category's rows get their sampling values (`SAMPLING_PRECEDENCE`), checked before any job runs."""

from eagle3_datagen.settings import SAMPLING_KEYS, ModelProfile, defaults, sheet_cell

# Where a row's sampling values come from, first found wins; written once, for the README and for
# every error a conflicting config gets.
SAMPLING_PRECEDENCE = (
    "the category sheet's cell for the row's mode, then model.modes.<mode>.sampling, then the config's "
    "sampling block, then the schema's default (temperature has none)"
)
# The sampling keys a category's row of the sheet may set.
SHEET_SAMPLING_KEYS = ("temperature", "top_p")


def sheet_sampling(category: dict, modes: tuple[str, ...], every_mode: tuple[str, ...]) -> dict[str, dict]:
    """{mode: {key: value}} of a category's sampling cells, for the modes of its mix (`modes`; the
    profile's are `every_mode`): a plain number where the mix has one mode, else a value per mode
    (thinking:1.0,instant:0.6), so that one mode is never silently sampled at the other's value."""
    per_mode: dict[str, dict] = {mode: {} for mode in every_mode}
    for key in SHEET_SAMPLING_KEYS:
        value = sheet_cell(category, key)
        if value is None:
            continue
        text = str(value).strip()
        if ":" not in text:
            if len(modes) > 1:
                raise ValueError(
                    f"field '{key}': the category mixes modes {', '.join(modes)}, and one {key} ({text}) would "
                    f"sample them all alike: give one per mode ({','.join(f'{m}:{text}' for m in modes)}). "
                    f"A row's sampling comes from {SAMPLING_PRECEDENCE}"
                )
            pairs = [(mode, text) for mode in every_mode]
        else:
            pairs = [part.strip().partition(":")[::2] for part in text.split(",")]
        for mode, number in pairs:
            mode = mode.strip()
            if ":" in text and mode not in modes:
                raise ValueError(
                    f"field '{key}': {text!r} names mode {mode!r}, which the category does not use "
                    f"(its modes: {', '.join(modes)})"
                )
            try:
                per_mode[mode][key] = float(number)
            except ValueError:
                raise ValueError(f"field '{key}': the value for {mode!r} is not a number: {number.strip()!r}") from None
            if not (0 <= per_mode[mode][key] and (key != "top_p" or 0 < per_mode[mode][key] <= 1)):
                raise ValueError(f"field '{key}': {number.strip()} for {mode!r} is out of range")
    return per_mode


def sampling_for(config: dict, category: dict, modes: tuple[str, ...] | None = None) -> dict:
    """A category's sampling values per serving mode ({mode: values}), each from the first place that
    gives it (SAMPLING_PRECEDENCE); `modes`: those of its mix (default: all). No temperature is refused."""
    profile = ModelProfile.from_config(config["model"])
    modes = tuple(modes or profile.mode_names)
    base = defaults("sampling", **(config.get("sampling") or {}))
    cells = sheet_sampling(category, modes, profile.mode_names)
    per_mode = {}
    for mode in profile.mode_names:
        sampling = {key: base[key] for key in SAMPLING_KEYS if key in base}
        sampling.update((profile.modes.get(mode) or {}).get("sampling") or {})
        sampling.update(cells.get(mode, {}))
        if "temperature" not in sampling:
            where = f"model.modes.{mode}.sampling.temperature, " if profile.modes else ""
            raise ValueError(
                f"no temperature for mode {mode!r}: set sampling.temperature, {where}or the category's temperature "
                f"cell (it has no default: model cards differ). A row's sampling comes from {SAMPLING_PRECEDENCE}"
            )
        per_mode[mode] = {key: sampling[key] for key in SAMPLING_KEYS}
    return per_mode
