"""The `eagle3-datagen` command: what a user runs by hand, one subcommand each (-h lists them).

Each subcommand hands its arguments to the module that owns it, whose own parser defines and checks
its options; the module is imported only when chosen, so that `status` starts fast.
"""

import argparse
import importlib
import sys
from collections.abc import Callable

PROG = "eagle3-datagen"


def _step(argv: list[str], prog: str) -> int:
    """One rule's step by hand, through the runner, as `scripts/step.py` runs it under Snakemake."""
    from eagle3_datagen.runner import run
    from eagle3_datagen.steps import STEPS, step_function

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run one rule's step by hand, with the rule's files and params taken from the config "
        "(or given as options: `%(prog)s NAME -h` lists them).",
    )
    parser.add_argument("name", choices=sorted(STEPS), metavar="NAME", help="the rule: " + ", ".join(sorted(STEPS)))
    if not argv or argv[0].startswith("-"):
        parser.parse_args(argv)  # -h, or the error that NAME is missing
    name, rest = argv[0], argv[1:]
    parser.parse_args([name])
    run(step_function(name), None, rest, prog=f"{prog} {name}")
    return 0


# name: (one line for the listing, the handler: a function, or the module whose `main(argv, prog)` it is)
COMMANDS: dict[str, tuple[str, str | Callable[[list[str], str], int]]] = {
    "status": ("how far a run is, per category and shard (read-only)", "eagle3_datagen.steps.status"),
    "audit": ("audit trainer rows made elsewhere, without a server", "eagle3_datagen.steps.audit"),
    "vocab-check": ("refuse a draft vocabulary built from other data", "eagle3_datagen.steps.vocab_check"),
    "engine": ("the CPU stand-in of an SGLang server", "eagle3_datagen.engine.__main__"),
    "step": ("run one rule's step by hand, as the rule runs it", _step),
}


def parser() -> argparse.ArgumentParser:
    from eagle3_datagen import __version__

    width = max(map(len, COMMANDS)) + 2
    listing = "\n".join(f"  {name.ljust(width)}{summary}" for name, (summary, _) in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Exact-token EAGLE-3 training data from SGLang's native /generate. The pipeline itself\n"
        "runs with `snakemake`; these are the commands run by hand.",
        epilog=f"commands:\n{listing}\n\n`{PROG} COMMAND -h` shows a command's options.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of the commands below")
    p.add_argument("args", nargs="*", default=[], metavar="ARG", help="the command's own arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        parser().parse_args(argv)  # -h, --version, or the error naming the commands
        return 2
    name, rest = argv[0], argv[1:]
    handler = COMMANDS[name][1]
    if isinstance(handler, str):
        handler = importlib.import_module(handler).main
    code = handler(rest, f"{PROG} {name}")
    return code if isinstance(code, int) else 0  # audit's main returns its summary
