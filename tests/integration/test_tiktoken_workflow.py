"""The whole DAG on a tokenizer in Kimi-K2.5's real format (TikToken remote code, eos [EOS]), with
the model profile of config/kimi-k2.5.yaml as it ships and the local engine loading the tokenizer
with --trust-remote-code as SGLang would, some of its answers ending on [EOS] as real ones may."""

import json

import pytest
import yaml
from workdir import ROOT, Workdir, demo_rows, multi_turn_rows

from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.storage.tables import read_provenance, read_rows

pytestmark = pytest.mark.slow

LITERAL = {
    "id": "literal",
    "messages": [{"role": "user", "content": "What does <|im_end|> do? And <|reserved_token_163700|>?"}],
}
BROKEN = '{"id": "broken", "messages": [{"role": "user"'
# A conversation of three turns whose first prompt is longer than Kimi-K2.5's context: each of its
# turns is a skipped row.
TOO_LONG = {
    "id": "too-long",
    "messages": [
        {"role": "user", "content": "Summarize: " + " ".join(f"w{i}" for i in range(70_000))},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": "Shorter?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Thanks."},
    ],
}
MULTI_TURN = multi_turn_rows()
EOS, TURN_END = 163585, 163586  # [EOS] and <|im_end|>: Kimi-K2.5's eos and its turns' end


@pytest.fixture(scope="module")
def tiktoken_run(tmp_path_factory, kimi_tiktoken_dir):
    wd = Workdir(
        tmp_path_factory.mktemp("tiktoken"),
        tokenizer=kimi_tiktoken_dir,
        model_dir=None,
        backend="scripted",
        categories={
            "chat": demo_rows("chat", 8) + [LITERAL, BROKEN, TOO_LONG] + MULTI_TURN,
            "code": demo_rows("code", 4),
        },
        engine_args="--eos-rate 0.5",
        max_new_tokens=256,
    )
    with open(ROOT / "config" / "kimi-k2.5.yaml") as fh:
        model = yaml.safe_load(fh)["model"]
    wd.config["model"] = dict(model, tokenizer=str(kimi_tiktoken_dir))
    wd.write_config()
    wd.snakemake("--cores", "2")
    return wd


def test_every_row_is_accounted_and_the_literal_row_is_data(tiktoken_run):
    wd = tiktoken_run
    dataset = {r["id"]: r for r in wd.jsonl("results/dataset/chat.jsonl") if r["turn"] == 0}
    rejected = {r["id"]: r for r in wd.jsonl("results/rejected/chat.jsonl") if r["turn"] == 0}
    assert len(dataset) + len(rejected) == 11 + len(MULTI_TURN) and "literal" in dataset  # every input row's first turn
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
            entry = served[(row["id"], row["sample_index"], row["turn"] + row["turns"] - 1, row["mode"])]
            assert row["input_ids"] == entry["input_ids"] + entry["output_ids"]


def test_the_checks_ran_on_it(tiktoken_run):
    wd = tiktoken_run
    report = json.loads((wd.path / "results" / "checks" / "chat.sequences.json").read_text())
    assert report["checked"] >= 9 and sum(report["violations"].values()) == 0
    counts = json.loads((wd.path / "results" / "checks" / "chat.json").read_text())
    assert counts["verdicts"]["total"] == report["checked"]


def test_answers_ending_on_eos_are_kept_exact_and_continue_their_conversation(tiktoken_run):
    wd = tiktoken_run
    generations = [r for c in ("chat", "code") for r in read_rows(wd.path / "results" / "generations" / f"{c}.parquet")]
    ok = [r for r in generations if r["status"] == "ok"]
    ends = {r["output_ids"][-1] for r in ok if r["finish_type"] == "stop"}
    assert ends == {EOS, TURN_END}  # both kept, as the server returned them
    on_eos = {(r["id"], r["turn"]) for r in ok if r["output_ids"][-1] == EOS}
    # A later turn follows an answer that ended on [EOS]: the chat layer trimmed it as SGLang's does.
    assert any((row_id, turn + 1) in {(r["id"], r["turn"]) for r in ok} for row_id, turn in on_eos)
    provenance = read_provenance(wd.path / "results" / "prompts" / "chat.parquet")
    assert provenance["stop_set"]["ids"] == [EOS, TURN_END]
    assert provenance["stop_set"]["sources"]["config.json"] == [EOS]


def test_a_conversation_too_long_from_its_first_turn_has_a_row_for_every_turn(tiktoken_run):
    wd = tiktoken_run
    rows = [r for r in wd.jsonl("results/rejected/chat.jsonl") if r["id"] == "too-long"]
    assert [r["turn"] for r in rows] == [0, 1, 2] and {r["status"] for r in rows} == {"skipped"}
    assert "over-long" in rows[0]["reason"]
    assert all(r["reason"].startswith("conversation ended: turn 0 was not sent: over-long") for r in rows[1:])
