"""Serving modes on the real tokenizer formats (Kimi-K2.5's TikToken, Qwen3's) with their production
profiles: each conversation rendered exactly in its modes, generated turn by turn in its own mode and
checked per mode; the mode mix drawn stably; a profile without modes as before; a changed mix reusing
what was generated; sampling per mode."""

import hashlib
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest
import yaml
from test_turns import CONVERSATIONS, SAMPLING, Run, engine, served

from conftest import REPO_ROOT, conversations, tokenize_file
from eagle3_datagen import workflow
from eagle3_datagen.generation.planning import make_builder
from eagle3_datagen.generation.requests import Request, RequestTemplate, parse_rid
from eagle3_datagen.generation.turns import turn_ends
from eagle3_datagen.settings import ClientSettings, ModelProfile, ModeMix, defaults
from eagle3_datagen.steps.check_parsers import check_parsers
from eagle3_datagen.steps.check_sequences import check_rows, check_sequences
from eagle3_datagen.steps.plan_generation import plan_generation
from eagle3_datagen.steps.summarize import category_summary
from eagle3_datagen.storage.tables import read_provenance, read_rows
from eagle3_datagen.tokens.chat_layer import ChatLayer
from eagle3_datagen.tokens.vocabulary import load_tokenizer

MODES = ("thinking", "instant")
BUDGET = {"max_new_tokens": 400, "min_new_tokens": 4, "reserve_tokens": 2}
PROMPT_RULES = {"prompt_matches_template", "prompt_suffix", "history_holds_answers"}
BY_ID = {c["id"]: c for c in CONVERSATIONS}


@dataclass
class Target:
    """A production model profile on a test tokenizer of its model's format."""

    name: str
    dir: Path
    model: dict
    tok: object

    def suffix(self, mode: str) -> list[int]:
        return [self.tok.convert_tokens_to_ids(t) for t in self.model["modes"][mode]["prompt_suffix"]]

    def oracle(self, messages: list, tools, mode: str | None = None, **kwargs) -> list[int]:
        """The tokenizer's own chat template, with the mode's template variables."""
        kwargs = {**(self.model["modes"][mode]["chat_template_kwargs"] if mode else {}), **kwargs}
        return self.tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )


PRODUCTION = {"kimi": ("kimi-k2.5", "kimi_tiktoken_dir"), "qwen3": ("qwen3", "qwen3_tokenizer_dir")}


def production_config(name: str) -> dict:
    with open(REPO_ROOT / "config" / f"{PRODUCTION[name][0]}.yaml") as fh:
        return yaml.safe_load(fh)


def make_target(request, name: str) -> Target:
    """The production profile `name` on its test tokenizer, sized to the stand-in engine's context."""
    tokenizer_dir = request.getfixturevalue(PRODUCTION[name][1])
    model = production_config(name)["model"]
    model = defaults("model", **{**model, "tokenizer": str(tokenizer_dir), "context_length": 4096})
    return Target(name, tokenizer_dir, model, load_tokenizer(ModelProfile.from_config(model)))


@pytest.fixture(scope="module", params=sorted(PRODUCTION))
def target(request):
    return make_target(request, request.param)


@pytest.fixture(scope="module")
def kimi(request):
    return make_target(request, "kimi")


def tokenized(tmp_path: Path, rows: list[dict], model: dict, name: str = "p", **settings) -> Path:
    """`rows` written as a prompt file `name` and tokenized (conftest.tokenize_file) into its prompts table."""
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tokenize_file(source, tmp_path / f"{name}.parquet", model, **{"budget": BUDGET, **settings})


class ModeRun(Run):
    """test_turns' Run of a category, on a target's profile and tokenizer, in the mode mix `modes`."""

    def __init__(self, tmp_path, target: Target, modes, *, rows=CONVERSATIONS, model=None):
        self.target, self.modes, self.config = target, modes, model or target.model
        super().__init__(tmp_path, None, target.dir, rows=rows)

    def tokenize(self, rows, modes=None, name="prompts"):
        self.model = self.config
        settings = {"category": "cat", "budget": self.budget, "turns": self.turns, "mode_mix": modes or self.modes}
        self.prompts = tokenized(self.tmp_path, rows, self.config, name, **settings)

    def serve(self):
        return engine(self.target.dir, self.record, trust_remote_code=self.config["trust_remote_code"])

    def plan(self, url) -> dict:
        settings = {"model": self.model, "sampling": SAMPLING, "engine": self.engine(url), "budget": self.budget}
        shard = {"category": "cat", "shard": 0, "shards": 1, "cache_dir": str(self.tmp_path / "cache")}
        return plan_generation(prompts=self.prompts, plan=self.tmp_path / "plan.json", **settings, **shard)


def rid_label(row: dict) -> str:
    return f"{row['id']}.{row['sample_index']}" + (f".t{row['turn']}" if row["turn"] else "") + f"@{row['mode']}"


@pytest.mark.parametrize("turns", ["last", "all"])
def test_every_mode_renders_as_the_tokenizers_own_template(tmp_path, target, turns):
    prompts = tokenized(tmp_path, CONVERSATIONS, target.model, mode_mix="all", turns=turns, samples_per_prompt=2)
    rows = read_rows(prompts)
    assert sorted((r["id"], r["mode"], r["sample_index"]) for r in rows) == sorted(product(BY_ID, MODES, range(2)))
    thinking = target.suffix("thinking")
    for r in rows:
        messages, tools = BY_ID[r["id"]]["messages"], BY_ID[r["id"]].get("tools")
        history = messages[: turn_ends(messages, turns)[0]]
        assert r["status"] == "ok" and r["prompt_ids"] == target.oracle(history, tools, r["mode"])
        suffix = target.suffix(r["mode"])
        assert r["prompt_ids"][-len(suffix) :] == suffix
        if r["mode"] == "instant":
            assert r["prompt_ids"][-len(thinking) :] != thinking
    think_id = target.tok.convert_tokens_to_ids("<think>")
    if target.name == "kimi":  # thinking ends inside the reasoning; instant has closed an empty one
        assert {r["mode"]: r["prompt_ids"][-1] == think_id for r in rows} == {"thinking": True, "instant": False}
    seeds = {}
    for r in rows:  # a conversation's seed is its own in every mode, and differs between its samples
        seeds.setdefault((r["id"], r["sample_index"]), set()).add(r["seed"])
    assert all(len(s) == 1 for s in seeds.values()) and len({s.pop() for s in seeds.values()}) == len(seeds)
    facts = read_provenance(prompts)["modes"]
    assert {m: (facts[m]["prompt_suffix_ids"], facts[m]["conversations"]) for m in MODES} == {
        m: (target.suffix(m), len(CONVERSATIONS)) for m in MODES
    }


@pytest.fixture(scope="module")
def generated(target, tmp_path_factory):
    """CONVERSATIONS generated turn by turn in both modes (`all`) against the stand-in engine."""
    run = ModeRun(tmp_path_factory.mktemp(target.name), target, "all")
    with run.serve() as url:
        out = run.generate(url)
    return run, out, read_rows(out)


def test_each_conversation_is_generated_turn_by_turn_in_its_mode(generated, target):
    run, _, rows = generated
    ok = [r for r in rows if r["status"] == "ok"]
    # Every turn of every conversation has its row in each mode, and each mode made later turns.
    every_turn = {(i, t) for i, c in BY_ID.items() for t in range(len(turn_ends(c["messages"], "all")))}
    assert all({(r["id"], r["turn"]) for r in rows if r["mode"] == m} == every_turn for m in MODES)
    assert {r["mode"] for r in ok if r["turn"] > 0} == set(MODES)
    record = {e["rid"].rsplit(".", 2)[0]: e for e in served(run.record) if e["status"] == 200}
    assert set(record) == {rid_label(r) for r in ok}  # each turn sent once, labelled with its mode
    for r in ok:
        sent = record[rid_label(r)]
        assert sent["input_ids"] == r["prompt_ids"] and sent["output_ids"] == r["output_ids"]
        # Every turn's prompt is its history in the conversation's mode, ending with that mode's suffix.
        tools = json.loads(r["tools"]) if r["tools"] else None
        assert r["prompt_ids"] == target.oracle(json.loads(r["messages"]), tools, r["mode"])
        assert r["prompt_ids"][-len(target.suffix(r["mode"])) :] == target.suffix(r["mode"])
    profile = ModelProfile.from_config(target.model)
    report = check_rows(rows, tokenizer=target.tok, profile=profile)
    assert report.checked == len(ok) and not {v["rule"] for v in report.violations} & PROMPT_RULES
    # A row checked as another mode than its own is caught: the check renders each row in its mode.
    later = next(r for r in ok if r["mode"] == "thinking" and r["turn"] == 1)
    swapped = [dict(r, mode="instant") if r is later else r for r in rows]
    caught = check_rows(swapped, tokenizer=target.tok, profile=profile).violations
    assert {"prompt_matches_template", "prompt_suffix"} <= {v["rule"] for v in caught if v["id"] == later["id"]}


def test_the_sequence_check_passes_in_every_mode(generated, target, tmp_path):
    _, out, rows = generated
    report = check_sequences(generations=out, sequence_report=tmp_path / "seq.json", model=target.model)
    assert report.checked == sum(r["status"] == "ok" for r in rows) and not report.n_violations


def test_the_parser_check_follows_each_rows_mode(generated, target, tmp_path):
    _, out, rows = generated
    ok = [r for r in rows if r["status"] == "ok"]
    summary = check_parsers(
        generations=out, verdicts=tmp_path / "v.parquet", verdict_counts=tmp_path / "v.json", model=target.model
    )
    verdicts = read_rows(tmp_path / "v.parquet")
    assert sorted((v["id"], v["turn"], v["mode"]) for v in verdicts) == sorted(
        (r["id"], r["turn"], r["mode"]) for r in ok
    )
    assert {m: c["total"] for m, c in summary["verdicts_by_mode"].items()} == Counter(r["mode"] for r in ok)
    # The chat layer forces reasoning in thinking mode only: the same answer parses differently.
    profile = ModelProfile.from_config(target.model)
    layers = {m: ChatLayer(target.tok, profile.for_mode(m)) for m in MODES}
    assert {m: layer.force for m, layer in layers.items()} == {"thinking": True, "instant": False}
    answer = target.tok.encode("Plan it.</think>Answer.", add_special_tokens=False)
    answer += [target.tok.convert_tokens_to_ids("<|im_end|>")]
    messages = {m: layer.answer_message(answer, "stop", None, []) for m, layer in layers.items()}
    assert messages["thinking"]["reasoning_content"] == "Plan it." and messages["thinking"]["content"] == "Answer."
    assert messages["instant"]["reasoning_content"] is None and "Plan it." in messages["instant"]["content"]


def test_a_mix_names_what_is_wrong_with_it():
    wrong = {
        "thinking:0.5,fast:0.5": ("unknown mode 'fast'",),
        "thinking:1,instant:1,thinking:2": ("'thinking' is named twice",),
        "thinking:0,instant:1": ("'thinking' must be a positive number", "'0'"),
        "instant:-0.5": ("'instant' must be a positive number", "'-0.5'"),
        "thinking:inf": ("'thinking' must be a positive number", "'inf'"),
        "thinking:lots,instant:1": ("the share of 'thinking' is not a number", "'lots'"),
    }
    for spec, words in wrong.items():
        with pytest.raises(ValueError) as caught:
            ModeMix.parse(spec, MODES)
        assert all(w in str(caught.value) for w in (spec, *words)), (spec, str(caught.value))
    # The workflow writes a category's mix canonically: its sheet cell, else the config's, else the first mode.
    config = {"model": production_config("kimi")["model"]}
    assert workflow.param("mode_mix", config, {"category": "c", "mode_mix": "thinking:3,instant:1"}) == (
        "thinking:0.75,instant:0.25"
    )
    every = {**config, "mode_mix": "all"}
    assert workflow.param("mode_mix", every, {"category": "c", "mode_mix": float("nan")}) == "all"
    assert workflow.param("mode_mix", config, {"category": "c"}) == "thinking:1.0"
    with pytest.raises(ValueError, match="field 'mode_mix': modes 'instant:2,fast:1': unknown mode 'fast'"):
        workflow.param("mode_mix", config, {"category": "math", "mode_mix": "instant:2,fast:1"})
    with pytest.raises(ValueError, match="config key mode_mix: modes 'fast': unknown mode 'fast'"):
        workflow.param("mode_mix", {**config, "mode_mix": "fast"}, {"category": "math"})


def test_the_draw_is_per_conversation_stable_and_independent_of_the_files_order(tmp_path, kimi):
    rows = conversations(40, prefix="q")
    shuffled = random.Random(5).sample(rows, len(rows))

    def drawn(rows, name, seed=0):
        prompts = tokenized(
            tmp_path, rows, kimi.model, name, mode_mix="thinking:1,instant:1", samples_per_prompt=2, seed=seed
        )
        return sorted((r["id"], r["sample_index"], r["mode"], r["seed"]) for r in read_rows(prompts))

    first = drawn(rows, "first")
    modes = {}
    for row_id, _, mode, _ in first:
        modes.setdefault(row_id, set()).add(mode)
    assert set(modes) == {r["id"] for r in rows} and all(len(m) == 1 for m in modes.values())  # both samples
    assert set().union(*modes.values()) == set(MODES)
    assert drawn(rows, "again") == first == drawn(shuffled, "shuffled")  # a rerun; the rows in another order
    assert [d[2] for d in drawn(rows, "reseeded", seed=1)] != [d[2] for d in first]  # the config's seed draws it
    every = read_rows(tokenized(tmp_path, rows, kimi.model, "all", mode_mix="all", samples_per_prompt=2))
    for mode in MODES:  # every conversation in every mode, with the same seeds
        in_mode = sorted((r["id"], r["sample_index"], r["seed"]) for r in every if r["mode"] == mode)
        assert in_mode == [(row_id, sample, seed) for row_id, sample, _, seed in first]


def test_a_mix_lands_on_its_shares():
    n, share = 2000, 0.7
    mix = ModeMix.parse(f"thinking:{share},instant:{1 - share:.1f}", MODES)
    draws = [mix.of(20260101, f"conversation-{i}") for i in range(n)]
    assert set(draws) == {("thinking",), ("instant",)}
    # A fair draw's count of thinking conversations is binomial(n, share): within 4 standard deviations
    # (±82 of 1400) but for about one run in 16,000; the draws are fixed, so the test is never flaky,
    # and a draw that ignored or swapped the shares (600 or 1000) is far outside.
    assert abs(draws.count(("thinking",)) - n * share) <= 4 * math.sqrt(n * share * (1 - share))
    assert [ModeMix.parse("thinking:7,instant:3", MODES).of(20260101, f"conversation-{i}") for i in range(n)] == draws
    assert all(ModeMix.parse("all", MODES).of(0, f"c{i}") == MODES for i in range(20))
    assert all(ModeMix.parse("instant", MODES).of(0, f"c{i}") == ("instant",) for i in range(20))


def plain_model(kimi: Target) -> dict:
    """The Kimi profile as it was before modes: thinking, its template variables and suffix the profile's own."""
    model = {k: v for k, v in kimi.model.items() if k != "modes"}
    return defaults("model", **{**model, "chat_template_kwargs": {"thinking": True}, "prompt_suffix": ["<think>"]})


def fingerprint_before_modes(model: dict, facts: dict, row: dict) -> str:
    """A row's request fingerprint as made before modes: the profile's template variables, flat sampling."""
    template = RequestTemplate(
        sampling=dict(SAMPLING),
        stop_token_ids=list(facts["stop_token_ids"]),
        vocab_size=int(facts["vocab_size"]),
        model_fingerprint={
            "model": model["name"],
            **{key: facts[key] for key in ("tokenizer_sha256", "chat_template_sha256", "vocab_size")},
            **{key: model[key] for key in ("chat_template_kwargs", "sglang_version")},
            "server": {"kind": "external"},
        },
    )
    req = Request(row["id"], row["sample_index"], row["prompt_ids"], row["max_new_tokens"], row["seed"])
    return template.fingerprint(req)


def requests_of(prompts: Path, model: dict) -> dict:
    """(id, sample_index) -> the turn-0 request of each prompts row, as planning makes it."""
    builder = make_builder(read_provenance(prompts), ModelProfile.from_config(model), SAMPLING, Run.engine("x"), BUDGET)
    return {(r["id"], r["sample_index"]): builder.start(r).request for r in read_rows(prompts)}


def test_a_profile_without_modes_renders_and_fingerprints_as_before(tmp_path, kimi):
    plain = plain_model(kimi)
    prompts = tokenized(tmp_path, CONVERSATIONS, plain, turns="last", samples_per_prompt=2)
    rows, facts = read_rows(prompts), read_provenance(prompts)
    assert [(r["id"], r["sample_index"], r["mode"]) for r in rows] == list(product(BY_ID, range(2), ["default"]))
    requests = requests_of(prompts, plain)
    for r in rows:
        conversation = BY_ID[r["id"]]
        assert r["prompt_ids"] == kimi.oracle(conversation["messages"], conversation.get("tools"), thinking=True)
        drawn = json.dumps([0, r["id"], r["sample_index"]], separators=(",", ":")).encode()
        assert r["seed"] == int(hashlib.sha256(drawn).hexdigest()[:15], 16) % (2**31 - 1)
        req = requests[(r["id"], r["sample_index"])]
        assert req.fingerprint == fingerprint_before_modes(plain, facts, r) and req.mode == "default"
        assert req.label == f"{r['id']}.{r['sample_index']}"  # no mode in the rid of a profile without modes
    assert list(facts["modes"]) == ["default"] and facts["mode_mix"]["spec"] == "default:1.0"


def test_one_mode_equal_to_the_plain_profile_reuses_its_answers(tmp_path, kimi):
    plain = plain_model(kimi)
    thinking = {"chat_template_kwargs": {"thinking": True}, "prompt_suffix": ["<think>"]}
    one_mode = defaults(
        "model", **{**plain, "chat_template_kwargs": {}, "prompt_suffix": [], "modes": {"thinking": thinking}}
    )
    run = ModeRun(tmp_path, kimi, None, model=plain)
    with run.serve() as url:
        first = read_rows(run.generate(url))
        plain_requests = requests_of(run.prompts, plain)
        run.config = one_mode
        run.tokenize(CONVERSATIONS, name="one_mode")
        assert {r["mode"] for r in read_rows(run.prompts)} == {"thinking"}
        one_requests = requests_of(run.prompts, one_mode)
        assert {k: (r.prompt_ids, r.fingerprint) for k, r in one_requests.items()} == {
            k: (r.prompt_ids, r.fingerprint) for k, r in plain_requests.items()
        }
        summary = run.plan(url)
    # Every answer journalled under the plain profile, later turns too, is this profile's.
    assert (summary["reused"], summary["to_send"]) == (sum(r["status"] == "ok" for r in first), 0)
    assert summary["reused"] > len(CONVERSATIONS)


def test_widening_a_mix_to_all_sends_only_the_other_mode(tmp_path, kimi):
    rows = CONVERSATIONS + conversations(6)
    run = ModeRun(tmp_path, kimi, "thinking:0.5,instant:0.5", rows=rows)
    drawn = {r["id"]: r["mode"] for r in read_rows(run.prompts)}
    assert len(drawn) == len(rows) and set(drawn.values()) == set(MODES)  # both modes drawn: both covered
    with run.serve() as url:
        first = read_rows(run.generate(url))
        sent_before = len(served(run.record))
        run.tokenize(rows, modes="all", name="all")
        summary = run.plan(url)
        second = read_rows(run.generate(url, "all"))
    assert all(r["mode"] == drawn[r["id"]] for r in first)  # every turn in its conversation's mode
    later = sum(len(turn_ends(c["messages"], "all")) - 1 for c in rows)
    ok_first = [r for r in first if r["status"] == "ok"]
    assert (summary["reused"], summary["to_send"], summary["later_turns"]) == (len(ok_first), len(rows), later)
    resent = [parse_rid(e["rid"])[0] for e in served(run.record)[sent_before:]]
    assert resent and all(mode != drawn[row_id] for row_id, _, _, mode in resent)
    assert {row_id for row_id, _, turn, _ in resent if turn == 0} == set(drawn)
    assert [r for r in second if r["mode"] == drawn[r["id"]]] == first  # the drawn mode's rows, as generated


def test_sampling_is_the_configs_then_the_modes_then_the_sheets(tmp_path):
    config = production_config("qwen3")
    config["sampling"] = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1}
    modes = {m: spec.get("sampling", {}) for m, spec in config["model"]["modes"].items()}
    assert tuple(modes) == MODES and modes["thinking"] != modes["instant"]  # the modes' own values differ
    assert all(modes[m][k] != v for m in MODES for k, v in config["sampling"].items() if k in modes[m])
    sheet = tmp_path / "categories.tsv"
    sheet.write_text(
        "category\tprompts\ttemperature\ttop_p\nplain\tp.jsonl\t\t\nwarm\tp.jsonl\t1.2\t\nboth\tp.jsonl\t1.3\t0.5\n"
    )
    cells = {"plain": {}, "warm": {"temperature": 1.2}, "both": {"temperature": 1.3, "top_p": 0.5}}
    categories = workflow.load_sheet(sheet)
    facts = {"tokenizer_sha256": "", "chat_template_sha256": "", "vocab_size": 1000, "stop_token_ids": [1]}
    profile = ModelProfile.from_config(config["model"])
    for name, cell in cells.items():
        got = workflow.param("sampling", config, categories.loc[name].to_dict())
        want = {m: {**config["sampling"], **modes[m], **cell} for m in MODES}
        assert got == want, name
        # Each mode's requests are sent with its own values.
        builder = make_builder(facts, profile, got, Run.engine("x"), BUDGET)
        for m in MODES:
            req = builder.request({"id": "x", "sample_index": 0, "seed": 1, "mode": m}, 0, [5, 6], 8)
            sent = json.loads(req.template.body(req, "x.0@m.n.1"))["sampling_params"]
            assert {k: sent[k] for k in want[m]} == want[m]
    # A profile without modes: one set of values, the config's then the sheet's.
    config["model"].pop("modes")
    assert workflow.param("sampling", config, categories.loc["warm"].to_dict()) == {
        "default": {**config["sampling"], "temperature": 1.2}
    }


def test_each_mode_sizes_its_rows_requests_and_plan_with_its_own_budget(tmp_path, kimi):
    """model.modes.<mode>.max_new_tokens: an instant answer asks for its own budget, not the thinking
    one, on every turn; the plan's cost preview counts each mode's; a request's timeout follows it."""
    run = ModeRun(tmp_path, kimi, "all")
    run.budget = {**run.budget, "modes": {"instant": {"max_new_tokens": 40}}}
    run.tokenize(CONVERSATIONS, name="budgets")
    ok = [r for r in read_rows(run.prompts) if r["status"] == "ok"]
    assert {r["mode"]: r["max_new_tokens"] for r in ok} == {"thinking": 400, "instant": 40}
    with run.serve() as url:
        summary = run.plan(url)
        rows = read_rows(run.generate(url))
    per_mode = Counter(r["mode"] for r in ok)
    assert summary["by_mode"] == {
        mode: {"to_send": per_mode[mode], "max_new_tokens_to_send": per_mode[mode] * budget}
        for mode, budget in (("thinking", 400), ("instant", 40))
    }
    assert summary["max_new_tokens_to_send"] == per_mode["thinking"] * 400 + per_mode["instant"] * 40
    generated = [r for r in rows if r["status"] == "ok"]
    assert {r["mode"] for r in generated if r["turn"] > 0} == set(MODES)
    sent = {rid_label(r): r for r in generated}
    for e in served(run.record):
        row = sent[e["rid"].rsplit(".", 2)[0]]
        budget = e["sampling_params"]["max_new_tokens"]
        assert budget == row["max_new_tokens"] and budget <= (40 if row["mode"] == "instant" else 400)
        assert len(row["output_ids"]) <= budget
    client = ClientSettings.from_config()
    assert client.request_timeout(40) < client.request_timeout(400)
    # The report's summary names each mode's budget.
    (tmp_path / "rejected.jsonl").write_text("")
    summary, _ = category_summary("cat", run.tmp_path / "gen.parquet", tmp_path / "rejected.jsonl")
    assert {r["mode"]: r["max_new_tokens"] for r in summary} == {"thinking": 400, "instant": 40, "all": 400}
