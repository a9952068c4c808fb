"""The whole DAG on a tokenizer in Kimi-K2.5's real format (TikToken remote code), with the local
engine loading it with --trust-remote-code as SGLang would."""

import json

import pytest
from workdir import Workdir, demo_rows

from eagle3_datagen.client import parse_rid
from eagle3_datagen.tables import read_rows

pytestmark = pytest.mark.slow

LITERAL = {
    "id": "literal",
    "messages": [{"role": "user", "content": "What does <|im_end|> do? And <|reserved_token_163700|>?"}],
}
BROKEN = '{"id": "broken", "messages": [{"role": "user"'


@pytest.fixture(scope="module")
def tiktoken_run(tmp_path_factory, kimi_tiktoken_dir):
    wd = Workdir(
        tmp_path_factory.mktemp("tiktoken"),
        tokenizer=kimi_tiktoken_dir,
        model_dir=None,
        backend="scripted",
        categories={"chat": demo_rows("chat", 8) + [LITERAL, BROKEN], "code": demo_rows("code", 4)},
    )
    wd.config["model"]["trust_remote_code"] = True
    wd.write_config()
    wd.snakemake("--cores", "2")
    return wd


def test_every_row_is_accounted_and_the_literal_row_is_data(tiktoken_run):
    wd = tiktoken_run
    dataset = {r["id"]: r for r in wd.jsonl("results/dataset/chat.jsonl") if r["turn"] == 0}
    rejected = {r["id"]: r for r in wd.jsonl("results/rejected/chat.jsonl") if r["turn"] == 0}
    assert len(dataset) + len(rejected) == 10 and "literal" in dataset  # every input row's first turn
    broken = next(r for r in rejected.values() if r["status"] == "skipped")
    assert broken["reason"].startswith("config/prompts/chat.jsonl:10: malformed JSON")
    prompt = [r for r in read_rows(wd.path / "results" / "prompts" / "chat.parquet") if r["id"] == "literal"][0][
        "prompt_ids"
    ]
    # The user's literal control text is text: only the template's own <|im_end|> ids remain, no reserved id.
    assert prompt.count(163586) == 2 and 163700 not in prompt and prompt[-1] == 163606


def test_exported_tokens_are_what_the_engine_generated(tiktoken_run):
    wd = tiktoken_run
    served = {parse_rid(e["rid"])[0]: e for e in wd.engine_record() if e["status"] == 200}
    for category in ("chat", "code"):
        for row in wd.jsonl(f"results/dataset/{category}.jsonl"):
            entry = served[(row["id"], row["sample_index"], row["turn"] + row["turns"] - 1)]
            assert row["input_ids"] == entry["input_ids"] + entry["output_ids"]


def test_the_checks_ran_on_it(tiktoken_run):
    wd = tiktoken_run
    report = json.loads((wd.path / "results" / "checks" / "chat.sequences.json").read_text())
    assert report["checked"] >= 9 and sum(report["violations"].values()) == 0
    counts = json.loads((wd.path / "results" / "checks" / "chat.json").read_text())
    assert counts["verdicts"]["total"] == report["checked"]
