"""Real public prompt sets (tests/realdata.py: ShareGPT, FastChat's ShareGPT sample, MT-Bench,
HumanEval, BFCL, from PyPI) through tokenize_prompts and through the whole workflow: every row and
every turn ends in exactly one place, whatever the file holds."""

import json
from collections import Counter

import pytest
import yaml
from workdir import ROOT, Workdir

from conftest import qwen3_model, tokenize_file
from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.settings import ModelProfile, defaults
from eagle3_datagen.storage.prompts import without_source
from eagle3_datagen.storage.tables import read_provenance, read_rows
from eagle3_datagen.tokens.vocabulary import load_tokenizer
from realdata import complete_elements, prompt_file

pytestmark = pytest.mark.slow

# Speakers whose turns a ShareGPT conversation needs to have something to answer.
ASKING = {"human", "user"}


def has_empty_turn(conversation: dict) -> bool:
    """A ShareGPT conversation with an empty human or assistant turn (0.4% of the real file)."""
    turns = conversation["conversations"]
    return any(t.get("from") != "system" and not str(t.get("value") or "").strip() for t in turns)


def tokenize(source, out, model, mode_mix=None):
    budget = {"max_new_tokens": 1024, "min_new_tokens": 16, "reserve_tokens": 2}
    return read_rows(
        tokenize_file(source, out, model, category="real", budget=budget, seed=1, turns="all", mode_mix=mode_mix)
    )


def reasons(rows) -> Counter:
    return Counter(without_source(r["reason"]) for r in rows if r["status"] != "ok")


def test_every_sharegpt_conversation_is_accounted_for(tmp_path, qwen3_tokenizer_dir):
    """All 17,671 real ShareGPT conversations, with the real Qwen3 tokenizer: one prompts row each, in
    file order; those with nothing to answer (empty, or only assistant or system turns: 1.5% of the
    file) are skipped rows saying so, counted independently here from the raw file."""
    source = prompt_file("sharegpt.json")
    raw = [json.loads(element) for element in complete_elements(source.read_text(encoding="utf-8"))]
    rows = tokenize(source, tmp_path / "sharegpt.parquet", qwen3_model(qwen3_tokenizer_dir, context_length=32768))

    assert [r["id"] for r in rows] == [c["id"] for c in raw]
    assert all(r["status"] == "ok" or r["reason"].startswith(f"{source}:") for r in rows)
    found = reasons(rows)
    assert not [why for why in found if "unexpected" in why]
    empty = sum(1 for c in raw if not c["conversations"])
    unanswerable = sum(
        1 for c in raw if c["conversations"] and not any(t.get("from") in ASKING for t in c["conversations"])
    )
    assert empty and unanswerable  # the real file's quirks are there to be met
    assert found["field 'conversations': empty conversation"] == empty
    nothing = sum(n for why, n in found.items() if "nothing to answer" in why)
    assert nothing >= unanswerable
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) > 0.97 * len(rows) and all(r["prompt_ids"] for r in ok)
    assert read_provenance(tmp_path / "sharegpt.parquet")["normalization"]["speakers_mapped"] > 0
    # An empty turn ends its conversation there instead of erasing it: most such conversations keep
    # their first turns (their later ones end in the workflow as skipped rows: real_run below); one
    # whose first turn holds the empty message is skipped, naming the field.
    with_empty = {c["id"] for c in raw if has_empty_turn(c)}
    assert 50 <= len(with_empty) <= 100, len(with_empty)
    kept = [r for r in rows if r["id"] in with_empty and r["status"] == "ok"]
    assert len(kept) > len(with_empty) / 2
    lost = [r for r in rows if r["id"] in with_empty and r["status"] != "ok"]
    assert lost and all("empty content" in r["reason"] or "nothing to answer" in r["reason"] for r in lost)


def test_fastchat_sharegpt_on_the_kimi_tiktoken_tokenizer(tmp_path, kimi_tiktoken_dir):
    """FastChat's 500-conversation ShareGPT array, as shipped, with Kimi-K2.5's profile and its
    TikToken tokenizer format, in both serving modes: every conversation usable in each, each
    thinking prompt ending in <think>, each instant prompt in <think></think>, and the two prompts of
    a conversation the same up to the generation prompt's end."""
    with open(ROOT / "config" / "kimi-k2.5.yaml") as fh:
        model = defaults("model", **dict(yaml.safe_load(fh)["model"], tokenizer=str(kimi_tiktoken_dir)))
    source = prompt_file("sharegpt_fastchat.json")
    rows = tokenize(source, tmp_path / "fastchat.parquet", model, mode_mix="all")
    assert len(rows) == 2 * len(json.loads(source.read_text())) == 1000
    assert not reasons(rows), reasons(rows)
    by_mode = {(r["id"], r["mode"]): r["prompt_ids"] for r in rows}
    for (row_id, mode), ids in by_mode.items():
        if mode == "thinking":
            instant = by_mode[(row_id, "instant")]
            assert ids[-1] == 163606 and instant[-2:] == [163606, 163607]  # <think>, <think></think>
            assert instant[:-1] == ids  # the same conversation, then the mode's own end


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, kimi_tiktoken_dir):
    """A few hundred real conversations of five sets through the whole workflow, turns: all, with
    config/kimi-k2.5.yaml's model profile on its TikToken tokenizer format and the scripted engine."""
    path = tmp_path_factory.mktemp("realdata")
    wd = Workdir(
        path, tokenizer=kimi_tiktoken_dir, model_dir=None, backend="scripted", categories={}, max_new_tokens=256
    )
    with open(ROOT / "config" / "kimi-k2.5.yaml") as fh:
        wd.config["model"] = dict(yaml.safe_load(fh)["model"], tokenizer=str(kimi_tiktoken_dir))
    wd.config["turns"] = "all"
    wd.write_config()
    prompts = path / "config" / "prompts"
    # The first 300 conversations of ShareGPT and the first 20 after them with an empty turn, each as
    # the file holds it, as one JSON array.
    elements = complete_elements(prompt_file("sharegpt.json").read_text(encoding="utf-8"))
    elements = elements[:300] + [e for e in elements[300:] if has_empty_turn(json.loads(e))][:20]
    (prompts / "sharegpt.json").write_text("[\n" + ",\n".join(elements) + "\n]\n", encoding="utf-8")
    sheet = {
        "sharegpt": ("config/prompts/sharegpt.json", ""),
        "fastchat": (str(prompt_file("sharegpt_fastchat.json")), "100"),
        "mtbench": (str(prompt_file("mtbench.jsonl")), ""),
        "humaneval": (str(prompt_file("humaneval.jsonl")), "60"),
        "bfcl": (str(prompt_file("bfcl.jsonl")), "120"),
    }
    # The sets are made in serving modes as a deployment mixes them: drawn per conversation, both, or one.
    mixes = {"sharegpt": "thinking:0.5,instant:0.5", "mtbench": "all", "bfcl": "thinking:0.7,instant:0.3"}
    lines = ["category\tprompts\tmax_rows\tmode_mix"] + [
        f"{name}\t{file}\t{n}\t{mixes.get(name, '')}" for name, (file, n) in sheet.items()
    ]
    (path / "config" / "categories.tsv").write_text("\n".join(lines) + "\n")
    wd.snakemake("--cores", "2", timeout=1800)
    wd.categories = list(sheet)
    return wd


def test_every_turn_of_every_real_row_ends_in_exactly_one_place(real_run):
    wd = real_run
    for category in wd.categories:
        prompts = read_rows(wd.path / "results" / "prompts" / f"{category}.parquet")
        expected = Counter(
            (p["id"], p["sample_index"], t, p["mode"]) for p in prompts for t in range(len(p["turn_ends"]) or 1)
        )
        found = Counter()
        for row in wd.jsonl(f"results/dataset/{category}.jsonl"):
            turns = range(row["turn"], row["turn"] + row["turns"])
            found.update((row["id"], row["sample_index"], t, row["mode"]) for t in turns)
        for row in wd.jsonl(f"results/rejected/{category}.jsonl"):
            found[(row["id"], row["sample_index"], row["turn"], row["mode"])] += 1
            assert row["reason"] and "unexpected" not in row["reason"], row
        assert found == expected, category
        if category in ("sharegpt", "mtbench"):  # multi-turn sets: later turns were made
            assert any(turn > 0 for _, _, turn, _ in expected), category
        if category in ("sharegpt", "mtbench", "bfcl"):  # made in both modes
            assert {mode for *_, mode in expected} == {"thinking", "instant"}, category
    # Conversations with an empty turn: the turns before it are in the dataset, the later ones are
    # rejected rows naming the empty message.
    ended = {r["id"] for r in wd.jsonl("results/rejected/sharegpt.jsonl") if "of the conversation" in r["reason"]}
    made = {r["id"] for r in wd.jsonl("results/dataset/sharegpt.jsonl")}
    assert len(ended & made) >= 3, (ended, made)


def test_real_rows_pass_the_checks_and_hold_what_the_engine_generated(real_run):
    wd = real_run
    served = {parse_rid(e["rid"])[0]: e for e in wd.engine_record() if e["status"] == 200}
    for category in wd.categories:
        report = json.loads((wd.path / "results" / "checks" / f"{category}.sequences.json").read_text())
        assert report["checked"] > 0 and sum(report["violations"].values()) == 0, (category, report)
        verdicts = json.loads((wd.path / "results" / "checks" / f"{category}.json").read_text())
        assert verdicts["verdicts"]["total"] == report["checked"]
        for row in wd.jsonl(f"results/dataset/{category}.jsonl"):
            last = served[(row["id"], row["sample_index"], row["turn"] + row["turns"] - 1, row["mode"])]
            assert row["input_ids"][: len(last["input_ids"])] == last["input_ids"]
            assert row["input_ids"][len(last["input_ids"]) :] == last["output_ids"]


def test_tool_declarations_of_bfcl_reach_the_prompt(real_run):
    """BFCL's function declarations (its own schema types, "dict" included) are rendered into the
    prompt by the tokenizer's own tool declaration: every usable row's prompt holds its functions."""
    wd = real_run
    tokenizer = load_tokenizer(ModelProfile.from_config(wd.config["model"]))
    prompts = [p for p in read_rows(wd.path / "results" / "prompts" / "bfcl.parquet") if p["status"] == "ok"]
    assert len(prompts) == 120
    for p in prompts:
        text = tokenizer.decode(p["prompt_ids"], skip_special_tokens=False)
        names = [t["function"]["name"] for t in json.loads(p["tools"])]
        assert text.startswith("<|im_system|>tool_declare<|im_middle|>") and all(n in text for n in names)
