"""The `eagle3-datagen` command: each subcommand is its module's own command line (same help, same
options), every rule's step runs by hand through it, and the wheel's package list is the library's."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_datagen import cli, runner, settings
from eagle3_datagen.steps import SAME_STEP, STEPS, step_function
from pins import pyproject

ROOT = Path(__file__).resolve().parents[2]


def help_text(capsys, command) -> str:
    with pytest.raises(SystemExit) as done:
        command()
    assert done.value.code == 0
    out = capsys.readouterr()
    assert not out.err
    return out.out


def own_main(name: str):
    """The module's own main, the one each subcommand must hand over to."""
    from eagle3_datagen.engine import __main__ as engine
    from eagle3_datagen.steps import audit, status, vocab_check

    return {"status": status.main, "audit": audit.main, "vocab-check": vocab_check.main, "engine": engine.main}[name]


# Options the user reads in the README, per subcommand: proof that the help is the real one.
DOCUMENTED = {
    "status": ["--directory", "--configfile", "--watch", "--json"],
    "audit": ["--data", "--out", "--config", "--tokenizer", "--stop-tokens", "--vocab-size"],
    "vocab-check": ["--vocab", "--train", "--tokenizer", "--draft-vocab-size", "--max-length"],
    "engine": ["--model-dir", "--port", "--backend", "--error-rate", "--record-dir"],
}


def test_the_listing_names_every_command_on_one_line(capsys):
    text = help_text(capsys, lambda: cli.main(["--help"]))
    listed = text.split("commands:\n", 1)[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed] == list(cli.COMMANDS)
    for line, (summary, _) in zip(listed, cli.COMMANDS.values(), strict=True):
        assert line.endswith(summary)
    assert text.startswith("usage: eagle3-datagen ")


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_command_is_its_modules_own_command_line(capsys, name):
    text = help_text(capsys, lambda: cli.main([name, "--help"]))
    assert text.startswith(f"usage: eagle3-datagen {name} ")
    for option in DOCUMENTED[name]:
        assert option in text, f"{name} --help does not list {option}"
    assert text == help_text(capsys, lambda: own_main(name)(["--help"], f"eagle3-datagen {name}"))


def test_a_commands_errors_are_its_own(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["audit", "--out", "x"])
    assert done.value.code == 2
    assert "eagle3-datagen audit: error: the following arguments are required: --data" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["nonsense"], ["--nonsense"]])
def test_no_or_an_unknown_command_is_refused_naming_them(capsys, argv):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: eagle3-datagen ")
    if argv == ["nonsense"]:
        assert "invalid choice: 'nonsense'" in err and "vocab-check" in err


def test_step_lists_every_rule(capsys):
    text = help_text(capsys, lambda: cli.main(["step", "--help"]))
    assert text.startswith("usage: eagle3-datagen step ")
    for name in STEPS:
        assert name in text
    with pytest.raises(SystemExit):
        cli.main(["step", "no_such_rule"])
    assert "invalid choice: 'no_such_rule'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(STEPS))
def test_step_name_help_lists_the_step_functions_parameters(capsys, name):
    import importlib

    step = getattr(importlib.import_module(f"eagle3_datagen.steps.{STEPS[name]}"), name)
    text = help_text(capsys, lambda: cli.main(["step", name, "--help"]))
    assert text.startswith(f"usage: eagle3-datagen step {name} ")
    given = [p for p in runner._parameters(step) if p.name not in ("category", "shard") and p.annotation is not dict]
    assert given, name
    for p in given:
        assert "--" + p.name.replace("_", "-") in text, f"step {name} -h does not list {p.name}"
    assert "--config" in text and "--category" in text


def rules_running_a_step() -> dict[str, str]:
    """{rule: the script it runs} for every rule of rules/*.smk with a `script:`."""
    import re

    found = {}
    for smk in (ROOT / "rules").glob("*.smk"):
        for rule, body in re.findall(
            r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), re.MULTILINE
        ):
            script = re.search(r'script:\s*\n\s*"([^"]+)"', body)
            if script:
                found[rule] = script.group(1)
    return found


def test_every_rule_runs_the_step_named_like_it():
    """Under Snakemake, scripts/step.py runs the step named like the rule; `step NAME` runs the same
    function by hand: one table (`steps.STEPS`) for both, and every rule that runs a script is in it."""
    rules = rules_running_a_step()
    assert set(rules.values()) == {"../scripts/step.py"}, rules
    assert set(rules) == set(STEPS) | set(SAME_STEP)
    for name in STEPS:
        assert step_function(name).__name__ == name
    for name, same in SAME_STEP.items():
        assert step_function(name) is step_function(same)
    assert sorted(p.name for p in (ROOT / "scripts").glob("*.py")) == ["step.py"]


def test_python_dash_m_runs_the_command_and_the_modules_entry_points():
    env_path = str(ROOT / "scripts")
    for argv, usage in [
        (["-m", "eagle3_datagen", "--help"], "usage: eagle3-datagen "),
        (["-m", "eagle3_datagen.engine", "--help"], "usage: python -m eagle3_datagen.engine "),
        (["-m", "eagle3_datagen.steps.vocab_check", "--help"], "usage: vocab_check.py "),
    ]:
        done = subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        )
        assert done.returncode == 0, (argv, done.stderr)
        assert done.stdout.startswith(usage), (argv, done.stdout[:200])


def test_the_wheel_lists_every_package_of_the_library():
    """pyproject.toml names the packages one by one (the schemas map in from the top): a new
    subpackage must be added there, or the installed command lacks it."""
    tool = pyproject()["tool"]["setuptools"]
    package = ROOT / "scripts" / "eagle3_datagen"
    found = {
        ".".join(("eagle3_datagen", *d.relative_to(package).parts)).rstrip(".")
        for d in [package, *package.rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    assert set(tool["packages"]) == found | {"eagle3_datagen.schemas"}
    assert tool["package-dir"] == {"eagle3_datagen": "scripts/eagle3_datagen", "eagle3_datagen.schemas": "schemas"}
    for pattern in tool["package-data"]["eagle3_datagen.schemas"]:
        assert sorted((ROOT / "schemas").glob(pattern)) == sorted((ROOT / "schemas").glob("*.yaml"))


def test_the_schema_is_found_in_the_checkout():
    assert settings.SCHEMA_PATH == ROOT / "schemas" / "config.schema.yaml"
    assert settings.schema_path("categories.schema.yaml") == ROOT / "schemas" / "categories.schema.yaml"
    assert inspect.getsourcefile(settings) == str(ROOT / "scripts" / "eagle3_datagen" / "settings.py")


def test_step_runs_the_rules_step_with_the_rules_files(tmp_path, monkeypatch):
    """`step merge_dataset` with no option merges what the rule would: every category's dataset of
    the config's sheet, into the rule's train.jsonl."""
    import json
    import logging
    import shutil

    shutil.copytree(ROOT / "config", tmp_path / "config")
    monkeypatch.chdir(tmp_path)
    categories = [line.split("\t")[0] for line in Path("config/categories.tsv").read_text().splitlines()[1:]]
    rows = {
        c: [{"id": f"{c}{i}", "input_ids": [1, i, n], "loss_mask": [0, 1, 1]} for i in range(2)]
        for n, c in enumerate(categories)
    }
    rows[categories[-1]].append(dict(rows[categories[0]][0], id="repeat"))
    Path("results/dataset").mkdir(parents=True)
    for category, lines in rows.items():
        Path(f"results/dataset/{category}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    try:
        assert cli.main(["step", "merge_dataset"]) == 0
    finally:
        logging.getLogger().handlers.clear()
    merged = [json.loads(line)["id"] for line in Path("results/train/train.jsonl").read_text().splitlines()]
    assert merged == [r["id"] for c in categories for r in rows[c] if r["id"] != "repeat"]
