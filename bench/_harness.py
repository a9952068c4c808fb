"""What every benchmark in bench/ shares: its command line and where its figures go.

`BenchParser` adds two options to a bench's own: `--smoke`, its smallest sizes (each bench declares
them once; the suite runs every bench with them, so a bench that no longer runs is found), and
`--figures PATH`, its headline figures as one JSON object, whose fields bench/README.md lists in its
table (the suite checks that the two agree). `require` stops a bench whose prepared input is missing
with one line naming the make target that prepares it.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The exit status of a bench whose prepared input is missing (automake's "skipped").
MISSING_INPUT = 77


class BenchParser(argparse.ArgumentParser):
    """A bench's argument parser; `smoke` holds the defaults that --smoke puts in place (any option
    given on the command line still wins)."""

    def __init__(self, doc: str, smoke: dict, **kwargs):
        super().__init__(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.smoke = smoke
        self.add_argument("--smoke", action="store_true", help="the smallest sizes: does it still run?")
        self.add_argument("--figures", type=Path, help="write the headline figures here, as one JSON object")

    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        if "--smoke" in argv:
            unknown = set(self.smoke) - {action.dest for action in self._actions}
            if unknown:
                raise ValueError(f"smoke sizes for options the bench lacks: {sorted(unknown)}")
            self.set_defaults(**self.smoke)
        return super().parse_args(argv, namespace)


def write_figures(args: argparse.Namespace, figures: dict) -> None:
    """Print the figures and write them to --figures."""
    text = json.dumps(figures, indent=1)
    print(text, flush=True)
    if args.figures:
        args.figures.parent.mkdir(parents=True, exist_ok=True)
        args.figures.write_text(text + "\n")


def require(path: Path, what: str, target: str) -> Path:
    """`path`, or exit with one line saying which make target prepares it."""
    if not path.exists():
        print(
            f"{Path(sys.argv[0]).name}: {what} is missing ({path.absolute()}): run `make {target}` first",
            file=sys.stderr,
        )
        raise SystemExit(MISSING_INPUT)
    return path
