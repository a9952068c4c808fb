"""The wheel, installed with pip into a fresh venv, gives a working `eagle3-datagen` outside the checkout.

The wheel is built from a copy of the checkout and must hold the library and its schemas, nothing
else, and declare requirements.txt's pins. The fresh venv sees the suite's third-party packages
(a `.pth` file naming the running interpreter's site-packages) but not the checkout's `scripts/`,
so the command runs only on what the wheel carries: the schema the config is validated against, the
tiktoken fixture the demo tokenizer is built from."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import orjson
import pytest
import yaml

import eagle3_datagen
from eagle3_datagen.cli import COMMANDS
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.steps.export_dataset import dataset_row
from eagle3_datagen.tokens.vocabulary import load_tokenizer
from pins import parse_pins, pyproject, requirement_pins

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scripts" / "eagle3_datagen"
# What a checkout may hold besides its sources: never copied into the build.
NOT_SOURCES = {".git", ".venv", ".cache", "build", "dist", "results", "logs", "resources", ".snakemake", "cache"}


def checked(cmd, cwd, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel as `pip wheel --no-deps .` builds it, from a copy (the build writes build/ and
    *.egg-info/ into its source, and a stale build/ could carry deleted modules into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda folder, names: [
            n
            for n in names
            if n == "__pycache__" or n.endswith(".egg-info") or (Path(folder) == ROOT and n in NOT_SOURCES)
        ],
    )
    # Without build isolation: the suite's setuptools builds it, offline.
    checked(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(source)], tmp
    )
    (built,) = tmp.glob("eagle3_datagen-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the wheel installed (no dependencies: those of the suite's venv are seen)."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    checked([*pip, "install", "--no-deps", "--no-index", str(wheel)], venv.parent)
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "suite_packages.pth").write_text("".join(f"{p}\n" for p in sorted(shared)))
    return venv


@pytest.fixture
def outside(tmp_path) -> Path:
    """A working directory outside the checkout."""
    work = tmp_path / "work"
    work.mkdir()
    assert ROOT not in work.parents
    return work


def test_the_wheel_holds_the_package_and_its_schemas_only(wheel):
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(whl.read(metadata).decode())
        entry_points = whl.read(metadata.replace("METADATA", "entry_points.txt")).decode()
    library = {
        f"eagle3_datagen/{p.relative_to(PACKAGE).as_posix()}"
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    schemas = {f"eagle3_datagen/schemas/{p.name}" for p in (ROOT / "schemas").glob("*.schema.yaml")}
    assert "eagle3_datagen/demo/tiktoken_fixture/tokenization_kimi.py" in library
    assert len(schemas) == 2
    assert {n for n in names if ".dist-info/" not in n} == library | schemas
    assert "eagle3-datagen = eagle3_datagen.cli:main" in entry_points
    # The declared pins are requirements.txt's: the pipeline's unconditionally, the test tools' in `test`.
    requires = meta.get_all("Requires-Dist")
    runtime = parse_pins([r for r in requires if "extra ==" not in r])
    tools = parse_pins([r for r in requires if 'extra == "test"' in r])
    assert {**runtime, **tools} == requirement_pins() and len(runtime) + len(tools) == len(requires)
    assert runtime == parse_pins(pyproject()["project"]["dependencies"])
    assert "pytest" in tools and "pytest" not in runtime
    assert meta["Requires-Python"] == ">=3.11"


def test_the_installed_command_runs_on_what_the_wheel_carries(venv, outside):
    python, command = venv / "bin" / "python", venv / "bin" / "eagle3-datagen"
    probe = (
        "import json, sys, eagle3_datagen.settings as s; print(json.dumps([s.__file__, str(s.SCHEMA_PATH), sys.path]))"
    )
    module, schema, path = json.loads(checked([python, "-c", probe], outside).stdout)
    assert Path(module).is_relative_to(venv) and Path(schema).is_relative_to(venv), (module, schema)
    assert not [p for p in path if p and (ROOT / "scripts").resolve() == Path(p).resolve()], path

    listing = checked([command, "--help"], outside).stdout
    assert listing.startswith("usage: eagle3-datagen ")
    for name, (summary, _) in COMMANDS.items():
        assert f"  {name}" in listing and summary in listing
        usage = checked([command, name, "--help"], outside).stdout
        assert usage.startswith(f"usage: eagle3-datagen {name} "), usage[:200]
    assert "--shard-generations" in checked([command, "step", "generate", "--help"], outside).stdout
    assert "--error-rate" in checked([command, "engine", "--help"], outside).stdout
    assert "--watch" in checked([command, "status", "--help"], outside).stdout
    assert checked([command, "--version"], outside).stdout.strip() == f"eagle3-datagen {eagle3_datagen.__version__}"


def test_status_reads_a_run_directory(venv, outside):
    shutil.copytree(ROOT / "config", outside / "config")
    sheet = [line.split("\t")[0] for line in (outside / "config" / "categories.tsv").read_text().splitlines()[1:]]
    views = json.loads(checked([venv / "bin" / "eagle3-datagen", "status", "--json"], outside).stdout)
    assert [v["category"] for v in views] == sheet and sheet
    for view in views:
        assert [s["state"] for s in view["shards"]] == ["waiting"]
        assert view["shards"][0]["error"] == "on tokenize_prompts"
    table = checked([venv / "bin" / "eagle3-datagen", "status"], outside).stdout
    assert "no Snakemake runs here" in table


def test_audit_judges_rows_with_the_installed_schema_and_tiktoken_fixture(venv, outside):
    # The Kimi-K2.5-format tokenizer (tiktoken.model and its remote code), built by the installed
    # package from the fixture the wheel carries.
    tokenizer = outside / "tokenizer"
    build = "import sys, pathlib, eagle3_datagen.demo.tokenizers as t; t.build_kimi_tiktoken_tokenizer(pathlib.Path(sys.argv[1]))"
    checked([venv / "bin" / "python", "-c", build, str(tokenizer)], outside)
    fixture = PACKAGE / "demo" / "tiktoken_fixture" / "tokenization_kimi.py"
    assert (tokenizer / "tokenization_kimi.py").read_bytes() == fixture.read_bytes()

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["model"].update(tokenizer=str(tokenizer), trust_remote_code=True)
    (outside / "audit.yaml").write_text(yaml.safe_dump(config))
    model = defaults("model", **config["model"])
    tok = load_tokenizer(ModelProfile.from_config(model))
    ids = tok.convert_tokens_to_ids
    prompt = tok.encode("user: what is 2 + 2?", add_special_tokens=False) + [ids("<think>")]
    answer = tok.encode("Two and two make four.", add_special_tokens=False) + [ids("</think>")]
    answer += tok.encode("The answer is 4.", add_special_tokens=False) + [ids("<|im_end|>")]
    generated = {"id": "q0", "sample_index": 0, "turn": 0, "category": "c", "finish_type": "stop", "seed": 1}
    clean = dataset_row(dict(generated, prompt_ids=prompt, output_ids=answer))
    oov = dict(clean, id="oov", input_ids=clean["input_ids"][:-3] + [len(tok) + 5] + clean["input_ids"][-2:])
    (outside / "train.jsonl").write_bytes(orjson.dumps(clean) + b"\n" + orjson.dumps(oov) + b"\n{not json\n")

    checked(
        [venv / "bin" / "eagle3-datagen", "audit", "--data", "train.jsonl", "--config", "audit.yaml", "--out", "audit"],
        outside,
    )
    records = [json.loads(line) for line in (outside / "audit" / "flags.jsonl").read_text().splitlines()]
    assert [(r["line"], r["id"], [f["code"] for f in r["flags"]]) for r in records] == [
        (1, "q0", []),
        (2, "oov", ["id_out_of_vocab"]),
        (3, None, ["unreadable_row"]),
    ]
    summary = json.loads((outside / "audit" / "audit.json").read_text())
    assert summary["rows"] == 3 and summary["clean_rows"] == 1
    assert summary["rows_per_code"]["id_out_of_vocab"] == 1 and summary["rows_per_code"]["unreadable_row"] == 1
    assert (outside / "audit" / "reasons.png").stat().st_size > 0
