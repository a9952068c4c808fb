"""What each rule needs from the config, computed in one place for the Snakefile and the command line.

Rules pass these as `params:`, so Snakemake reruns a category exactly when its own effective
parameters change, and scripts never read the global config.
"""

import dataclasses
import json
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.sampling import sampling_for
from eagle3_datagen.settings import RENAMED_KEYS, Budget, ModelProfile, ModeMix, defaults, sheet_cell, validate_config
from eagle3_datagen.storage.progress import ProgressOnly, terminal_format
from eagle3_datagen.storage.prompt_rows import ReadOptions


def load_sheet(path: str | Path):
    import pandas as pd

    sheet = pd.read_csv(path, sep="\t", dtype={"category": str, "prompts": str}, comment="#")
    if "category" in sheet.columns:
        sheet = sheet.set_index("category", drop=False)
    return sheet


def configure(config: dict, basedir: str | Path, configfiles=("config",)):
    """Everything a run checks before any job (rules/common.smk): the config, with the schema's defaults
    filled in, the engine, then the category sheet; returns the sheet. `configfiles` name the config in errors."""
    validate_config(config, " + ".join(map(str, configfiles)))
    check_engine(config["engine"])
    sheet = load_sheet(config["categories"])
    validate_sheet(sheet, Path(basedir) / "schemas" / "categories.schema.yaml", config["categories"], config)
    return sheet


def validate_sheet(sheet, schema_path: str | Path, sheet_path: str | Path, config: dict | None = None) -> None:
    """Check every row of the category sheet; an error names the sheet's file, line and field.
    With the (validated) `config`, each row's mode mix must name the model's modes and its sampling
    and budget must resolve (`sampling.sampling_for`, `budget_for`)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(yaml.safe_load(Path(schema_path).read_text()))
    problems = [
        f"{sheet_path}: column {old!r} is now called {new!r}" for old, new in RENAMED_KEYS.items() if old in sheet
    ]
    if "category" not in sheet.columns or "prompts" not in sheet.columns:
        raise ValueError(f"{sheet_path}: the sheet needs the columns 'category' and 'prompts' (tab-separated)")
    for line, record in enumerate(sheet.to_dict("records"), start=2):  # line 1 is the header
        # Empty cells are NaN, and a column with one is read as floats.
        record = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in record.items() if v == v}
        for error in sorted(validator.iter_errors(record), key=lambda e: list(e.path)):
            where = f"field '{error.path[0]}'" if error.path else "row"
            problems.append(f"{sheet_path}:{line}: {where}: {error.message}")
        if config is not None:
            try:
                sampling_for(config, record, mode_mix(config, record).names)
                budget_for(config, record)
            except ValueError as exc:
                problems.append(f"{sheet_path}:{line}: {exc}")
    duplicated = sheet["category"][sheet["category"].duplicated()].tolist()
    if duplicated:
        problems.append(f"{sheet_path}: category names must be unique; repeated: {', '.join(map(str, duplicated))}")
    if problems:
        raise ValueError("invalid category sheet:\n  " + "\n  ".join(problems))


def category_row(sheet, category: str) -> dict:
    return {k: v for k, v in sheet.loc[category].to_dict().items() if v == v}  # drop NaN cells


def shard_count(category: dict) -> int:
    """Generate jobs of a category: each its own server (and GPU job), so N nodes run N at once."""
    return int(category.get("shards", 1))


# Where a row's budget comes from, first found wins; written once, for the docs and for the errors.
BUDGET_PRECEDENCE = (
    "max_new_tokens: the category sheet's max_new_tokens cell, then model.modes.<mode>.max_new_tokens, then the "
    "config's max_new_tokens; min_new_tokens: model.modes.<mode>.min_new_tokens, then the config's min_new_tokens"
)


def budget_for(config: dict, category: dict) -> dict:
    """A category's budget (`Budget`'s fields, `modes` only where a mode has values of its own), each
    value from the first place that gives it (BUDGET_PRECEDENCE); refused where a mode's min_new_tokens
    exceeds its max_new_tokens: every row of it would be skipped."""
    cell = sheet_cell(category, "max_new_tokens")
    budget = {
        "max_new_tokens": int(config["max_new_tokens"] if cell is None else cell),
        "min_new_tokens": int(config["min_new_tokens"]),
        "reserve_tokens": int(config["reserve_tokens"]),
    }
    modes = {}
    for mode, spec in ((config.get("model") or {}).get("modes") or {}).items():
        own = {key: int(spec[key]) for key in ("max_new_tokens", "min_new_tokens") if (spec or {}).get(key) is not None}
        if cell is not None:
            own.pop("max_new_tokens", None)
        if own:
            modes[str(mode)] = own
    if modes:
        budget["modes"] = modes
    for mode in [None, *modes]:
        b = Budget(**budget).for_mode(mode)
        if b.min_new_tokens > b.max_new_tokens:
            where = f"mode {mode!r}" if mode else "the run"
            raise ValueError(
                f"{where}: min_new_tokens {b.min_new_tokens} is above max_new_tokens {b.max_new_tokens}, so every "
                f"row would be skipped as over-long. A row's budget comes from {BUDGET_PRECEDENCE}"
            )
    return budget


def _export(config: dict, category: dict) -> dict:
    """The export block, with the category's merge_turns where its row of the sheet sets one."""
    export = defaults("export", **config.get("export", {}))
    merge = sheet_cell(category, "merge_turns")
    if merge is not None:
        export["merge_turns"] = merge if isinstance(merge, bool) else str(merge).lower() in ("true", "1", "yes")
    return export


def mode_mix(config: dict, category: dict):
    """The category's serving-mode mix (`settings.ModeMix`), checked against the model's modes: its
    sheet cell, else the config's mode_mix, else the first mode."""
    cell = sheet_cell(category, "mode_mix")
    names = ModelProfile.from_config(config["model"]).mode_names
    try:
        return ModeMix.parse(cell if cell is not None else config.get("mode_mix"), names)
    except ValueError as exc:
        raise ValueError(f"field 'mode_mix': {exc}" if cell is not None else f"config key mode_mix: {exc}") from None


# The params of every rule, by name, for the rules (rules/common.smk: get_param) and the runner: a
# category's values come from its row of the sheet, else (no --category) the global values apply.
# Each rule declares exactly the params it reads, so Snakemake reruns a job when one of them changes.
PARAMS = {
    "model": lambda c, row: c["model"],
    "budget": budget_for,
    "samples_per_prompt": lambda c, row: int(sheet_cell(row, "samples_per_prompt", c["samples_per_prompt"])),
    "seed": lambda c, row: int(c["seed"]),
    "on_bad_rows": lambda c, row: c["on_bad_rows"],
    "max_unexpected_row_share": lambda c, row: float(c["max_unexpected_row_share"]),
    "allow_empty": lambda c, row: bool(c["allow_empty_categories"]),
    "reading": lambda c, row: dataclasses.asdict(ReadOptions.from_category(row, int(c["seed"]))),
    "sampling": lambda c, row: sampling_for(c, row, mode_mix(c, row).names),
    "engine": lambda c, row: c["engine"],
    "client": lambda c, row: c["client"],
    "max_failed_share": lambda c, row: float(c["max_failed_share"]),
    "cache_dir": lambda c, row: str(c["cache_dir"]),
    "shards": lambda c, row: shard_count(row),
    "export": _export,
    "quality": lambda c, row: dict(c["quality"]),
    "turns": lambda c, row: str(sheet_cell(row, "turns") or c.get("turns", "all")),
    "tool_divergence": lambda c, row: str(sheet_cell(row, "tool_divergence") or c.get("tool_divergence", "end")),
    "mode_mix": lambda c, row: mode_mix(c, row).to_json(),
    "categories": lambda c, row: list(load_sheet(c["categories"])["category"]),
    "demo_model": lambda c, row: c["demo_model"],
    "batch": lambda c, row: dict(c["batch"]),
    "pilot": lambda c, row: dict(c["pilot"]),
}


def param(name: str, config: dict, category: dict | None = None):
    """The value of rule param `name` for one category (or for none)."""
    return PARAMS[name](config, category or {})


def load_config(path: str | Path) -> dict:
    """The config as Snakemake would see it, validated against the schema (for command-line use)."""
    return validate_config(yaml.safe_load(Path(path).read_text()), str(path))


def setup_logging(log_file: str | Path | None = None, level: int = logging.INFO) -> None:
    """Configure logging once: to the rule's log file, or to stderr when run by hand. With a log file,
    progress lines (`storage.progress`) also go to stderr, which Snakemake shows in its terminal."""
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        terminal = logging.StreamHandler(sys.stderr)
        terminal.addFilter(ProgressOnly())
        terminal.setFormatter(logging.Formatter(terminal_format(log_file), datefmt="%H:%M:%S"))
        handlers: list[logging.Handler] = [logging.FileHandler(log_file), terminal]
    else:
        handlers = [logging.StreamHandler(sys.stderr)]
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", handlers=handlers, force=True
    )


def plan_sends(plan_file: str | Path) -> bool:
    """Whether a shard's plan has anything to send (then its generate job needs the server)."""
    return json.loads(Path(plan_file).read_text())["to_send"] > 0


def server_resources(engine: dict, plan_file: str | Path | None = None) -> dict:
    """What a job that launches the server asks SLURM for: `gpu` (a one-node server's GPUs), or,
    for a server across nodes, `gres` (gpu:N on each node: a job-wide --gpus could pile them on one
    node) and `nodes`. Nothing but one node when the plan has nothing left to send."""
    settings = EngineSettings.from_config(engine)
    if plan_file is not None and not plan_sends(plan_file):
        return {"gpu": 0, "gres": "", "nodes": 1}
    if settings.nodes > 1:
        return {"gpu": 0, "gres": f"gpu:{settings.gpus}" if settings.gpus else "", "nodes": settings.nodes}
    return {"gpu": settings.gpus, "gres": "", "nodes": 1}


def model_weights(engine: dict) -> list[str]:
    """The weights file of a server the job launches from a folder the config names (the stand-in's
    model backend: part of its fingerprint, so a rebuilt model reruns its jobs)."""
    folder = EngineSettings.from_config(engine).server.weights_dir
    return [f"{folder}/model.safetensors"] if folder else []


def generate_job(engine: dict) -> dict:
    """CPUs, memory and wall time of a generate job (engine.job of the validated config)."""
    return dataclasses.asdict(EngineSettings.from_config(engine).job)


def check_engine(engine: dict) -> None:
    """Refuse, before any job runs, an engine configuration that would corrupt data."""
    settings = EngineSettings.from_config(engine)  # refuses an sglang block without model_path, or a refused flag
    if not settings.server.launched and not settings.server.urls:
        raise ValueError("engine.kind is external but engine.external.urls is empty")


def check_slurm_status(settings, *, run=None) -> str:
    """Make sure, before any job is submitted, that the SLURM executor can read its jobs' states;
    returns what was decided.

    The SLURM plugin reads job states with `sacct` wherever the binary exists, and without slurmdbd
    every query fails: Snakemake would wait forever, silently. So the plugin's query is tried here;
    where it fails, job states are read with `squeue` instead, provided a finished job stays visible
    to it long enough (`MinJobAge` at least 3 x slurm-init-seconds-before-status-checks, the plugin's
    own threshold); otherwise it stops with what to change."""
    run = run or (lambda cmd: subprocess.run(shlex.split(cmd), capture_output=True, text=True, timeout=30))
    command = getattr(settings, "status_command", None) or "sacct"
    init_s = int(getattr(settings, "init_seconds_before_status_checks", None) or 40)

    def min_job_age(why: str, unknown_ok: bool) -> int | None:
        """MinJobAge, refused with `why` where squeue would not see finished jobs long enough."""
        found = re.search(r"^MinJobAge\s*=\s*(\d+)", run("scontrol show config").stdout or "", re.MULTILINE)
        age = int(found.group(1)) if found else None
        if (age is None and unknown_ok) or (age is not None and age >= 3 * init_s):
            return age
        raise ValueError(
            f"{why}, and squeue sees a finished job only for MinJobAge = {age if age is not None else 'unknown'} s "
            f"(scontrol show config | grep MinJobAge), less than 3 x slurm-init-seconds-before-status-checks "
            f"({init_s} s): the SLURM executor could never see jobs finish. Set slurm-init-seconds-before-status-checks "
            f"to {max((age or 0) // 3, 1)} or less in your profile (~/.config/snakemake/slurm/config.yaml), or ask for "
            "a longer MinJobAge."
        )

    if command == "sacct":
        probe = run(
            "sacct -X --parsable2 --clusters all --noheader --format=JobIdRaw,State "
            "--starttime now-1hours --endtime now --name eagle3-datagen-status-probe"
        )
        if probe.returncode == 0:
            return "sacct"
        said = " / ".join((probe.stderr or probe.stdout).strip().splitlines()[:2]) or f"exit code {probe.returncode}"
        why = f"SLURM's accounting does not answer here (`sacct` said: {said})"
        age = min_job_age(why, unknown_ok=False)
        try:
            settings.status_command = "squeue"
        except (AttributeError, TypeError):
            raise ValueError(f"{why}: add `slurm-status-command: squeue` to your profile") from None
        logging.getLogger(__name__).warning(
            "%s: job states are read with squeue (MinJobAge %d s). Add `slurm-status-command: squeue` to your "
            "profile to make it the stated choice.",
            why,
            age,
        )
        return "squeue (sacct does not answer)"
    if command == "squeue":
        min_job_age("slurm-status-command is squeue", unknown_ok=True)
        return "squeue"
    return command
