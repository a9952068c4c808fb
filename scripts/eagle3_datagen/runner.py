"""The one runner of every rule's step, under Snakemake or from the command line: `run(step, snakemake)`.

A step is a plain function with keyword-only parameters named after its rule's inputs, outputs,
params, wildcards and logs. Under Snakemake each is taken from the job by that name; run by hand, the
same names become options (`--prompts PATH`), and what is not given comes from `layout.PATHS` and
`workflow.PARAMS` for `--category`/`--shard` and `--config`. An error is logged with its traceback
and re-raised, so the job fails.
"""

import argparse
import inspect
import logging
import re
import resource
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_datagen.storage.layout import PATHS
from eagle3_datagen.workflow import PARAMS, category_row, load_config, load_sheet, setup_logging, shard_count


def run(step: Callable, snakemake: Any = None, argv: list[str] | None = None, prog: str | None = None) -> Any:
    if snakemake is not None:
        setup_logging(snakemake.log[0] if len(snakemake.log) else None)
        kwargs = from_snakemake(step, snakemake)
    else:
        kwargs = from_command_line(step, argv, prog)
    log = logging.getLogger(step.__name__)
    started = time.perf_counter()
    try:
        result = step(**kwargs)
    except Exception:
        log.exception("%s failed", step.__name__)
        raise
    log.info("%s done in %.1f s, %s", step.__name__, time.perf_counter() - started, peak_rss())
    return result


def peak_rss() -> str:
    """This process's peak resident memory (and its finished children's, such as a local engine): Linux's
    VmHWM, as getrusage's ru_maxrss would also count the parent's memory at the fork (Snakemake's)."""
    try:
        status = Path("/proc/self/status").read_text()
        own = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
    except (OSError, StopIteration, ValueError):
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    text = f"peak RSS {own:.0f} MB"
    return text + (f" (largest child process {children:.0f} MB)" if children else "")


_PEAK_LINE = re.compile(r" done in [0-9.]+ s, peak RSS (\d+) MB(?: \(largest child process (\d+) MB\))?")


def logged_peak_rss(log_text: str) -> tuple[float, float] | None:
    """(own, largest finished child's or 0) peak RSS in MB that `run` logged at the step's end, or None."""
    found = _PEAK_LINE.search(log_text)
    return None if found is None else (float(found.group(1)), float(found.group(2) or 0))


def _parameters(step: Callable) -> list[inspect.Parameter]:
    """The step's keyword-only parameters, annotations resolved (a module may postpone them)."""
    hints = typing.get_type_hints(step)
    return [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in inspect.signature(step).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    ]


def _convert(value: Any, annotation: Any) -> Any:
    """A value from Snakemake or argparse as the step's annotation asks (Path, list[Path], Path | None, ...)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return _convert(value, kinds[0]) if len(kinds) == 1 else value
    hints = typing.get_args(annotation) if typing.get_origin(annotation) is list else None
    if hints is not None:
        items = [value] if isinstance(value, str) else list(value)
        return [_convert(v, hints[0]) for v in items]
    if annotation is Path:
        return Path(str(value))
    if annotation in (int, float, str):
        return annotation(value)
    return value


def from_snakemake(step: Callable, sm: Any) -> dict:
    """Each parameter by name from the job's input, output, params, wildcards or log (one of them)."""
    sources = {kind: dict(getattr(sm, kind).items()) for kind in ("input", "output", "params", "wildcards", "log")}
    kwargs = {}
    for p in _parameters(step):
        found = [kind for kind, items in sources.items() if p.name in items]
        if len(found) > 1:
            raise TypeError(f"{step.__name__}: the rule names {p.name!r} in {' and '.join(found)}; rename one")
        if found:
            kwargs[p.name] = _convert(sources[found[0]][p.name], p.annotation)
        elif p.default is p.empty:
            raise TypeError(
                f"{step.__name__}: the rule gives no input, output, param, wildcard or log named {p.name!r}"
            )
    return kwargs


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def from_command_line(step: Callable, argv: list[str] | None = None, prog: str | None = None) -> dict:
    """Each parameter from its option, or else as the rule would give it (paths and params tables)."""
    params = _parameters(step)
    parser = argparse.ArgumentParser(prog=prog, description=" ".join((step.__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument("--config", default="config/config.yaml", help="config file (default: %(default)s)")
    parser.add_argument("--category", help="a category of the category sheet")
    parser.add_argument("--shard", type=int, default=0, help="shard of the category (default: %(default)s)")
    for p in params:
        # Config blocks (dict params) come from --config only; files and scalars can be given.
        if p.name not in ("category", "shard") and p.annotation is not dict:
            many = typing.get_origin(p.annotation) is list
            default = PATHS.get(p.name, "from --config and --category")
            parser.add_argument(_option(p.name), dest=p.name, nargs="+" if many else None, help=f"default: {default}")
    args = parser.parse_args(argv)
    setup_logging()
    config = load_config(args.config)
    sheet = load_sheet(config["categories"])
    row = category_row(sheet, args.category) if args.category else None
    kwargs = {}
    for p in params:
        value = getattr(args, p.name, None)
        if value is None:
            value = _from_tables(p.name, typing.get_origin(p.annotation) is list, config, sheet, row, args)
        if value is not None:
            kwargs[p.name] = _convert(value, p.annotation)
        elif p.default is p.empty:
            parser.error(f"{_option(p.name)} is needed (or --category, to take it from the config)")
    return kwargs


def _from_tables(name: str, many: bool, config: dict, sheet, row: dict | None, args: argparse.Namespace):
    """The value the rule would give this parameter: a path of layout.PATHS or a param of workflow.PARAMS."""
    if name in ("category", "shard"):
        return getattr(args, name)
    category = args.category
    if name == "source":  # the category's own prompts file
        return row["prompts"] if row is not None else None
    if name in PATHS:
        pattern = PATHS[name]
        if many and "{shard}" in pattern:
            return (
                None if row is None else [pattern.format(category=category, shard=s) for s in range(shard_count(row))]
            )
        if many:
            return [pattern.format(category=c) for c in sheet["category"]]
        if "{category}" in pattern and category is None:
            return None
        return pattern.format(category=category, shard=args.shard)
    return PARAMS[name](config, row or {}) if name in PARAMS else None
