"""The entry-point runner: one step function, called from a Snakemake job or from the command line."""

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake.iocontainers import Namedlist

from eagle3_datagen import runner
from eagle3_datagen.steps import STEPS, step_function
from eagle3_datagen.storage.layout import PATHS
from eagle3_datagen.workflow import PARAMS

ROOT = Path(__file__).resolve().parents[2]

CALLS = []


def step(*, prompts: Path, plan: Path, category: str, shard: int, sampling: dict, shards: int, note: str = "-") -> str:
    """A step under test."""
    CALLS.append(
        dict(prompts=prompts, plan=plan, category=category, shard=shard, sampling=sampling, shards=shards, note=note)
    )
    return "done"


def failing_step(*, prompts: Path) -> None:
    raise ValueError("broken input")


def named(**items) -> Namedlist:
    nl = Namedlist()
    for key, value in items.items():
        nl.append(value)
        nl._add_name(key)
    return nl


def job(tmp_path, **params):
    return SimpleNamespace(
        input=named(prompts="results/prompts/math.parquet"),
        output=named(plan="results/plan/math/shard_1.json"),
        params=named(sampling={"temperature": 0.5}, shards=3, **params),
        wildcards=named(category="math", shard="1"),
        log=named(client=str(tmp_path / "logs" / "x.log")),
    )


def test_a_snakemake_job_gives_each_parameter_by_name(tmp_path):
    CALLS.clear()
    assert runner.run(step, job(tmp_path)) == "done"
    assert CALLS == [
        dict(
            prompts=Path("results/prompts/math.parquet"),
            plan=Path("results/plan/math/shard_1.json"),
            category="math",
            shard=1,
            sampling={"temperature": 0.5},
            shards=3,
            note="-",
        )
    ]
    assert (tmp_path / "logs" / "x.log").exists()


def test_a_job_that_lacks_a_parameter_is_named(tmp_path):
    sm = job(tmp_path)
    sm.params = named(shards=3)
    with pytest.raises(TypeError, match="'sampling'"):
        runner.run(step, sm)


def test_an_error_is_logged_once_with_its_traceback_and_raised(tmp_path):
    sm = SimpleNamespace(
        input=named(prompts="p"),
        output=named(),
        params=named(),
        wildcards=named(),
        log=named(log=str(tmp_path / "e.log")),
    )
    with pytest.raises(ValueError, match="broken input"):
        runner.run(failing_step, sm)
    text = (tmp_path / "e.log").read_text()
    assert text.count("failing_step failed") == 1 and "Traceback" in text and "broken input" in text
    logging.getLogger().handlers.clear()


def demo_config(tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    (tmp_path / "categories.tsv").write_text(
        "category\tprompts\tshards\ttemperature\nmath\tm.jsonl\t4\t0.3\ncode\tc.jsonl\t\t\n"
    )
    config["categories"] = str(tmp_path / "categories.tsv")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_command_line_takes_paths_and_params_from_the_tables(tmp_path):
    CALLS.clear()
    runner.run(step, argv=["--config", str(demo_config(tmp_path)), "--category", "math", "--shard", "2"])
    call = CALLS[0]
    assert call["prompts"] == Path(PATHS["prompts"].format(category="math"))
    assert call["plan"] == Path(PATHS["plan"].format(category="math", shard=2))
    assert (call["category"], call["shard"], call["shards"]) == ("math", 2, 4)
    assert all(s["temperature"] == 0.3 for s in call["sampling"].values())  # the category's own cell, in every mode


def test_an_option_overrides_the_table(tmp_path):
    CALLS.clear()
    runner.run(
        step,
        argv=["--config", str(demo_config(tmp_path)), "--category", "code", "--plan", "elsewhere.json", "--note", "n"],
    )
    assert CALLS[0]["plan"] == Path("elsewhere.json") and CALLS[0]["note"] == "n" and CALLS[0]["shards"] == 1


def test_every_step_parameter_is_in_a_table():
    """A parameter the command line cannot derive would have to be typed by hand every time."""
    for name in STEPS:
        for p in runner._parameters(step_function(name)):
            assert (
                p.name in PATHS
                or p.name in PARAMS
                or p.name in ("category", "shard", "source")
                or p.default is not p.empty
            ), (name, p.name)


def test_a_name_the_rule_gives_twice_is_refused(tmp_path):
    sm = job(tmp_path)
    sm.input = named(prompts="a", plan="b")
    with pytest.raises(TypeError, match="'plan' in input and output"):
        runner.run(step, sm)


def test_optional_annotations_are_converted_like_their_type():
    """A step parameter `Path | None` (an optional output) gets a Path from Snakemake's string."""
    from pathlib import Path

    from eagle3_datagen.runner import _convert

    assert _convert("results/vocab/provenance.json", Path | None) == Path("results/vocab/provenance.json")
    assert _convert(None, Path | None) is None
    assert _convert("3", int | None) == 3
    assert _convert(["a", "b"], list[Path] | None) == [Path("a"), Path("b")]


def test_the_peak_rss_a_step_logs_is_read_back_from_its_log(tmp_path):
    log = tmp_path / "logs" / "x.log"
    assert runner.logged_peak_rss(log.read_text() if log.exists() else "") is None
    runner.run(step, job(tmp_path))
    own, child = runner.logged_peak_rss(log.read_text())
    assert own > 10 and child >= 0
    assert runner.logged_peak_rss("s done in 2.0 s, peak RSS 402 MB (largest child process 451 MB)") == (402, 451)
