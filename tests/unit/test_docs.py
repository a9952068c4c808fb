"""Every path the README, docs/, config/README.md and the configs' comments name exists: a file of
the checkout where it names one, or a file a run writes where it names an output (one that the
rules or the library name too), so that docs cannot go on naming files that moved."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "scripts" / "eagle3_datagen"
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIG_COMMENTS = sorted((ROOT / "config").glob("*.yaml"))
CHECKOUT = ("config", "schemas", "rules", "scripts", "tests", "bench", "docs", "envs", "profiles", "report")
OUTPUTS = ("results", "logs", "benchmarks", "cache", "resources")
SUBPACKAGES = tuple(p.name for p in LIBRARY.iterdir() if p.is_dir() and not p.name.startswith("_"))
# Paths the docs name on purpose though no run writes them: said why.
NAMED_AS_ABSENT = {
    "profiles/default/": "docs/slurm.md explains why the workflow ships no workflow profile",
    "cache/journal/math.old": "docs/slurm.md's example of moving a category's journals away",
}
PATH = re.compile(r"(?<![\w./~-])((?:[a-z_]+/)+[\w.{}*,<>-]*|test_\w+\.py)")


def named_paths(text: str) -> set[str]:
    return {m.rstrip(".,;:") for m in PATH.findall(text)}


def shape(path: str) -> str:
    """A path with its placeholders ({category}, *, <id>) as one mark."""
    return re.sub(r"\{[^}]*\}|<[^>]*>|\*", "\0", path)


def matches(pattern: str, path: str, *, placeholder: str = "[^/]*", tail: str = "") -> bool:
    """Whether `path` is an instance of `pattern`, or a folder of one (`tail`)."""
    regex = "".join(placeholder if c == "\0" else re.escape(c) for c in shape(pattern.rstrip("/")))
    return re.fullmatch(regex + tail, shape(path.rstrip("/"))) is not None


def written_paths() -> set[str]:
    """The output paths the rules and the library name (every f-string's placeholders as marks),
    and a shard's journal and the files beside it."""
    from eagle3_datagen.storage.layout import journal_path

    journal = str(journal_path("cache", "{category}", "{shard}", "{shards}"))
    found = {journal, f"{journal}.lock", f"{journal}.progress.json"}
    # Each attempt's logs, named by generation.servers.attempt_logs from the rule's log and the job.
    found |= {f"logs/{{rule}}/{{category}}/attempts/{{name}}.{{time}}.{{host}}.{{pid}}{s}.log" for s in ("", ".server")}
    literal = re.compile(r"""["']((?:""" + "|".join(OUTPUTS) + r""")/[^"'\s]*)["']""")
    for path in [*ROOT.glob("rules/*.smk"), *LIBRARY.rglob("*.py"), ROOT / "Snakefile"]:
        found.update(literal.findall(path.read_text()))
    return found


WRITTEN = written_paths()


def exists(path: str) -> bool:
    first = path.split("/")[0]
    if path.startswith("test_"):
        return any((ROOT / "tests").rglob(path))
    if path in NAMED_AS_ABSENT:
        return True
    if first in OUTPUTS:
        # The doc's path, or a folder of it, matches what the code writes; the code's placeholders
        # hold no dot, so that {category}.jsonl never stands for math.rejected.jsonl.
        folders = {w.rsplit("/", n)[0] for w in WRITTEN for n in range(w.count("/"))}
        return any(matches(path, w, tail="(/.*)?") for w in WRITTEN) or any(
            matches(w, path, placeholder="(?:\0|[^/.\0]*)") for w in WRITTEN | folders
        )
    if first in SUBPACKAGES and not path.endswith((".py", "/")):
        return True  # a module's attribute (storage/layout.PATHS) or prose (tokens/s), not a file
    base = ROOT if first in CHECKOUT else LIBRARY if first in SUBPACKAGES else None
    if base is None:
        return True  # not a path of this project (a URL's path, a home folder, another program's file)
    pattern = re.sub(r"\{[^}]*\}|<[^>]*>", "*", path.rstrip("/"))
    return any(base.glob(pattern)) if "*" in pattern else (base / pattern).exists()


def cases():
    for doc in DOCS:
        yield doc, doc.read_text()
    for config in CONFIG_COMMENTS:
        comments = "\n".join(line.split("#", 1)[1] for line in config.read_text().splitlines() if "#" in line)
        yield config, comments


@pytest.mark.parametrize("doc, text", list(cases()), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_every_path_a_doc_names_exists(doc, text):
    missing = sorted(p for p in named_paths(text) if not exists(p))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_check_finds_a_path_that_moved():
    assert not exists("results/dataset/{category}.rejected.jsonl")
    assert not exists("logs/generate/{category}.log")
    assert not exists("scripts/eagle3_datagen/figures.py") and not exists("figures.py".join(["steps/", ""]))
    assert exists("results/rejected/{category}.jsonl") and exists("logs/generate/{category}/shard_{shard}.log")
    assert exists("results/plots/*.png") and exists("results/vocab/") and exists("steps/generate.py")
    assert slug("The quality gate: data worth training on") == "the-quality-gate-data-worth-training-on"
    assert named_paths("see `results/dataset/{category}.jsonl`, and tests/unit/test_docs.py.") == {
        "results/dataset/{category}.jsonl",
        "tests/unit/test_docs.py",
    }


def slug(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_between_the_docs_leads_to_its_file_and_heading(doc):
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
        path = (doc.parent / target) if target else doc
        if not path.exists():
            broken.append(target)
        elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.*)$", path.read_text(), re.MULTILINE)}:
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)} links to what is not there: {broken}"
