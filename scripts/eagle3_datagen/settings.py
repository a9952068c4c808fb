"""Typed views of the validated config: the model profile, budgets, client, pilot, export and demo settings.

The schema (`schemas/config.schema.yaml`) is the one place that holds defaults: validation fills them
in, and `defaults()` reads them for code that builds settings from part of a config (tests, benchmarks).
"""

import copy
import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def schema_path(name: str) -> Path:
    """A schema of `schemas/`: in the installed package's `eagle3_datagen/schemas/`, else at the checkout's top."""
    package = Path(__file__).resolve().parent
    installed = package / "schemas" / name
    return installed if installed.is_file() else package.parents[1] / "schemas" / name


SCHEMA_PATH = schema_path("config.schema.yaml")


@functools.cache
def schema() -> dict:
    import yaml

    return yaml.safe_load(SCHEMA_PATH.read_text())


def _node(path: tuple[str, ...]) -> dict:
    node = schema()
    for key in path:
        node = node["properties"][key]
    return node


def fill_defaults(instance: dict, node: dict) -> dict:
    """Fill the schema's defaults into `instance` (in place, nested objects too) and return it."""
    for key, sub in node.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict) and "properties" in sub:
            fill_defaults(instance[key], sub)
    return instance


# Keys that were renamed: a config or sheet that still uses the old name is told the new one.
RENAMED_KEYS = {"modes": "mode_mix"}


def validate_config(config: dict, source: str = "config") -> dict:
    """The config with the schema's defaults filled in (in place), or a ValueError listing every
    problem by its key, naming a required key that has no default with what it is for."""
    import jsonschema

    problems = [
        f"{source}: key {old!r} is now called {new!r}" for old, new in RENAMED_KEYS.items() if old in (config or {})
    ]
    if not isinstance(config, dict):
        raise ValueError(f"{source}: the config must be a mapping of keys, not {type(config).__name__}")
    _open_required(config, schema())
    fill_defaults(config, schema())
    for error in sorted(jsonschema.Draft202012Validator(schema()).iter_errors(config), key=lambda e: list(e.path)):
        where = ".".join(str(p) for p in error.path)
        if error.validator == "required":
            key = error.message.split("'")[1]
            where = f"{where}.{key}" if where else key
            described = error.schema.get("properties", {}).get(key, {}).get("description", "")
            problems.append(f"{source}: {where} has no default and must be set: {described}".rstrip(": "))
        else:
            problems.append(f"{source}: {where or 'config'}: {error.message}")
    if problems:
        raise ValueError("invalid config:\n  " + "\n  ".join(dict.fromkeys(problems)))
    local = config["engine"]["local"]
    if local["model_dir"] is None:  # the schema's null: a model folder holds the tokenizer and the weights
        local["model_dir"] = config["model"]["tokenizer"]
    return config


def _open_required(instance: dict, node: dict) -> None:
    """Add each missing required object as {}, so that validation names the keys it needs (model.tokenizer)."""
    for key in node.get("required", []):
        sub = node.get("properties", {}).get(key, {})
        if sub.get("type") == "object" and key not in instance:
            instance[key] = {}
        if isinstance(instance.get(key), dict):
            _open_required(instance[key], sub)


def defaults(*path: str, **given: Any) -> dict:
    """The object at `path` of the config (e.g. "client"), with `given` values and the schema's defaults."""
    return fill_defaults(dict(given), _node(path))


class ConfigGroup:
    """A config block (`block` names it) as a frozen dataclass, with the schema's defaults; an unknown key is an error."""

    block = ""

    @classmethod
    def from_config(cls, values: dict | None = None, **overrides: Any):
        return cls(**defaults(cls.block, **{**(values or {}), **overrides}))


@dataclass(frozen=True)
class PilotSettings(ConfigGroup):
    block = "pilot"  # the share of each category's conversations (per mode) the pilot sends, at least min_rows
    fraction: float
    min_rows: int


@dataclass(frozen=True)
class DemoModelSettings(ConfigGroup):
    block = "demo_model"  # the demo model's training
    steps: int
    seed: int


@dataclass(frozen=True)
class ExportSettings(ConfigGroup):
    block = "export"  # the draft vocabulary (the target's size: else the tokenizer's), turns merged, filters
    draft_vocab_size: int
    target_vocab_size: int | None
    merge_turns: bool
    filters: dict


# The SGLang version whose wire format and parser semantics apply unless the model profile names another.
SGLANG_VERSION: str = _node(("model", "sglang_version"))["default"]

# The one mode of a model profile that names no modes (model.modes).
DEFAULT_MODE = "default"
# Every mode: the mix that makes each conversation in all of them, and the mode of a table row that
# counts all of them (a category's or the run's whole row). No mode may be named so.
ALL_MODES = "all"


def sheet_cell(category: dict, key: str, default=None):
    """A cell of a category's row of the sheet, or `default` where it is empty (NaN in a TSV)."""
    value = category.get(key)
    return default if value is None or value != value or value == "" else value


def mode_totals(modes: list[str]) -> tuple[list[str], str]:
    """The totals a table with a row per mode ends with: (the modes totalled on their own, where there
    are several; the mode of the overall total: ALL_MODES, or the one mode)."""
    if len(modes) > 1:
        return list(modes), ALL_MODES
    return [], modes[0] if modes else DEFAULT_MODE


# Sampling keys the pipeline sends on every request. SGLang's /generate applies none of the model's
# generation_config defaults, so every one of these is always explicit.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class ModelProfile:
    """What the pipeline must know about the target model and its chat template."""

    name: str
    tokenizer: str
    context_length: int
    trust_remote_code: bool = False
    chat_template_kwargs: dict = field(default_factory=dict)
    prompt_suffix: tuple = ()
    reasoning_start: str | None = "<think>"
    reasoning_end: str | None = None
    stop_tokens: tuple = ()
    eos_tokens: tuple = ()  # stop generation without ending a turn (flagged unexpected_stop)
    prompt_only_tokens: tuple = ()
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    sglang_version: str = SGLANG_VERSION
    # Named serving modes (name -> what the mode changes), in order; empty: the profile is one mode.
    modes: dict = field(default_factory=dict)
    # The mode this profile renders (`for_mode`); DEFAULT_MODE for a profile without modes.
    mode: str = DEFAULT_MODE
    # The profile's own values, before its mode's were laid over them (None: they are these).
    base: "ModelProfile | None" = field(default=None, repr=False, compare=False)

    @classmethod
    def from_config(cls, model: dict) -> "ModelProfile":
        model = defaults("model", **model)
        modes = {str(name): dict(spec or {}) for name, spec in (model.get("modes") or {}).items()}
        eos, stops = tuple(model.get("eos_tokens") or ()), tuple(model.get("stop_tokens") or ())
        if both := sorted(set(eos) & set(stops)):
            raise ValueError(
                f"model.eos_tokens and model.stop_tokens both name {both}: a token either ends a turn or not"
            )
        return cls(
            name=model["name"],
            tokenizer=str(model["tokenizer"]),
            context_length=int(model["context_length"]),
            trust_remote_code=bool(model.get("trust_remote_code", False)),
            chat_template_kwargs=dict(model.get("chat_template_kwargs") or {}),
            prompt_suffix=tuple(model.get("prompt_suffix") or ()),
            reasoning_start=model.get("reasoning_start", "<think>"),
            reasoning_end=model.get("reasoning_end"),
            stop_tokens=stops,
            eos_tokens=eos,
            prompt_only_tokens=tuple(model.get("prompt_only_tokens") or ()),
            reasoning_parser=model.get("reasoning_parser"),
            tool_call_parser=model.get("tool_call_parser"),
            sglang_version=str(model.get("sglang_version", SGLANG_VERSION)),
            modes=modes,
        )._applied(next(iter(modes), DEFAULT_MODE))

    @property
    def mode_names(self) -> tuple[str, ...]:
        """The profile's modes, in order: its named modes, or the one DEFAULT_MODE."""
        return tuple(self.modes) or (DEFAULT_MODE,)

    def for_mode(self, name: str) -> "ModelProfile":
        """The profile as mode `name` renders: its template variables, prompt suffix and prompt-only tokens."""
        if name not in self.mode_names:
            raise ValueError(f"model {self.name!r} has no mode {name!r}; its modes: {', '.join(self.mode_names)}")
        return self if name == self.mode else (self.base or self)._applied(name)

    def _applied(self, name: str) -> "ModelProfile":
        """This (base) profile with mode `name`'s keys over its own."""
        spec = self.modes.get(name)
        if spec is None:
            return self
        return dataclasses.replace(
            self,
            mode=name,
            chat_template_kwargs={**self.chat_template_kwargs, **(spec.get("chat_template_kwargs") or {})},
            prompt_suffix=tuple(spec.get("prompt_suffix", self.prompt_suffix)),
            prompt_only_tokens=tuple(spec.get("prompt_only_tokens", self.prompt_only_tokens)),
            base=self,
        )


@dataclass(frozen=True)
class Budget:
    """How many new tokens a row may ask for (DESIGN §3), and `modes`: {mode: {max_new_tokens, min_new_tokens}}."""

    max_new_tokens: int
    min_new_tokens: int
    reserve_tokens: int
    modes: dict = field(default_factory=dict)

    def for_mode(self, mode: str) -> "Budget":
        own = self.modes.get(mode) or {}
        return Budget(
            int(own.get("max_new_tokens", self.max_new_tokens)),
            int(own.get("min_new_tokens", self.min_new_tokens)),
            self.reserve_tokens,
        )


@dataclass(frozen=True)
class ClientSettings(ConfigGroup):
    block = "client"  # the generate client's settings
    concurrency: int | str  # a number, or "auto": follow the server's load, up to max_concurrency
    max_concurrency: int
    queue_target: int
    load_poll_s: float
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float
    request_timeout_floor_s: float
    request_timeout_per_token_s: float
    progress_interval_s: float
    resume: bool = True

    @property
    def auto(self) -> bool:
        return self.concurrency == "auto"

    @property
    def cap(self) -> int:
        """The most requests ever in flight: the fixed number, or auto's ceiling."""
        return int(self.max_concurrency) if self.auto else int(self.concurrency)

    def request_timeout(self, max_new_tokens: int) -> float:
        """A long answer is slow, not stuck: the timeout grows with the row's token budget."""
        return self.request_timeout_floor_s + self.request_timeout_per_token_s * max_new_tokens


@dataclass(frozen=True)
class ModeMix:
    """Which serving modes make a category's rows: `all` (every conversation once in each mode), or
    shares of the modes, one drawn per conversation from a hash of (seed, its id): stable across
    reruns and independent of the file's order, and the conversation keeps it on every turn."""

    shares: tuple[tuple[str, float], ...]  # (mode, share), in the profile's order; shares sum to 1
    every: bool = False  # `all`

    @classmethod
    def parse(cls, spec: str | None, modes: tuple[str, ...]) -> "ModeMix":
        """`spec` as written in the sheet or config: None (the first mode), `all`, a mode name, or
        `name:share,name:share` (shares are normalized; each must be positive)."""
        text = "" if spec is None or spec != spec else str(spec).strip()
        if not text:
            return cls(((modes[0], 1.0),))
        if text == ALL_MODES:
            return cls(tuple((m, 1.0 / len(modes)) for m in modes), every=True)
        weights: dict[str, float] = {}
        for part in text.split(","):
            name, _, share = part.strip().partition(":")
            name = name.strip()
            if name not in modes:
                raise ValueError(f"modes {text!r}: unknown mode {name!r}; the model's modes are {', '.join(modes)}")
            if name in weights:
                raise ValueError(f"modes {text!r}: mode {name!r} is named twice")
            try:
                weight = float(share) if share.strip() else 1.0
            except ValueError:
                raise ValueError(f"modes {text!r}: the share of {name!r} is not a number: {share!r}") from None
            if not weight > 0 or weight == float("inf"):
                raise ValueError(f"modes {text!r}: the share of {name!r} must be a positive number, not {share!r}")
            weights[name] = weight
        total = sum(weights.values())
        return cls(tuple((m, weights[m] / total) for m in modes if m in weights))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.shares)

    def of(self, seed: int, row_id: str) -> tuple[str, ...]:
        """The modes of one conversation: all of them, or the one its draw falls in."""
        if self.every or len(self.shares) == 1:
            return self.names
        draw = int(stable_hash([seed, "mode", row_id])[:15], 16) / 16**15
        for mode, share in self.shares:
            draw -= share
            if draw < 0:
                return (mode,)
        return (self.shares[-1][0],)

    def to_json(self) -> str:
        return ALL_MODES if self.every else ",".join(f"{m}:{round(s, 6)}" for m, s in self.shares)


def canonical_json(obj: Any) -> bytes:
    """An object's canonical JSON (sorted keys, no spaces, UTF-8): what `stable_hash` hashes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def stable_hash(obj: Any) -> str:
    """sha256 of an object's canonical JSON."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()
