"""Every turn on-policy: each assistant turn regenerated on the model's own earlier answers, with
exact tokens per turn (in-process, against the scripted engine and its request record)."""

import json

import pytest

from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.generation.planning import make_builder, make_plan, open_journal
from eagle3_datagen.generation.turns import splice_tool_results, turn_ends
from eagle3_datagen.settings import Budget, ModelProfile, defaults
from eagle3_datagen.steps.check_parsers import check_parsers
from eagle3_datagen.steps.check_sequences import check_rows, check_sequences
from eagle3_datagen.steps.export_dataset import export_dataset
from eagle3_datagen.steps.generate import generate
from eagle3_datagen.storage.tables import read_provenance, read_rows
from eagle3_datagen.tokens.chat_layer import ChatLayer
from engine_thread import running_engine

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CLIENT = {"concurrency": 3, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
KIMI = {
    "name": "kimi-shaped-test",
    "context_length": 4096,
    "chat_template_kwargs": {"thinking": True},
    "prompt_suffix": ["<think>"],
    "reasoning_end": "</think>",
    "stop_tokens": ["<|im_end|>"],
    "prompt_only_tokens": ["<think>"],
    "reasoning_parser": "kimi_k2",
    "tool_call_parser": "kimi_k2",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def call(name, i=0, args='{"city": "Oslo"}'):
    return {"id": f"functions.{name}:{i}", "type": "function", "function": {"name": name, "arguments": args}}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, calls=None):
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def tool(call_id, text):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


ORIGINAL = "ORIGINAL-ANSWER"  # text of every original assistant message: it must never reach a prompt
CONVERSATIONS = [
    {  # four user turns, no tools
        "id": "chat",
        "messages": [
            user("Hi, who are you?"),
            assistant(f"{ORIGINAL} 1"),
            user("What can you do?"),
            assistant(f"{ORIGINAL} 2"),
            user("Tell me a joke."),
            assistant(f"{ORIGINAL} 3"),
            user("Another one, please."),
        ],
    },
    {  # four turns: after the user, after the tool result the regenerated call gets spliced onto, ...
        "id": "weather",
        "tools": [WEATHER],
        "messages": [
            user("Weather in Oslo?"),
            assistant("", [call("get_weather")]),
            tool("functions.get_weather:0", '{"temp_c": -3}'),
            assistant(f"{ORIGINAL} cold"),
            user("And tomorrow?"),
            assistant(f"{ORIGINAL} 4"),
            user("Thanks!"),
        ],
    },
    {  # the original called another tool than the model does: the results cannot answer it
        "id": "search",
        "tools": [WEATHER, SEARCH],
        "messages": [
            user("Who won yesterday?"),
            assistant("", [call("web_search", args='{"query": "winner"}')]),
            tool("functions.web_search:0", "Team A"),
            user("Great."),
        ],
    },
    {"id": "single", "messages": [user("Just one question.")]},
]


@pytest.fixture(scope="module")
def kimi_tok(kimi_tokenizer):
    return kimi_tokenizer


def served(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def label(rid):
    """'{id}.{sample}[.t{turn}]' of a rid '{label}.{nonce}.{attempt}'."""
    return rid.rsplit(".", 2)[0]


class Run:
    """A category of CONVERSATIONS through tokenize, generate (one engine, one record) and the checks."""

    def __init__(
        self,
        tmp_path,
        make_prompts,
        kimi_tokenizer_dir,
        *,
        max_new_tokens=400,
        rows=CONVERSATIONS,
        turns="all",
        tool_divergence="end",
    ):
        self.tmp_path, self.make_prompts, self.turns = tmp_path, make_prompts, turns
        self.tool_divergence = tool_divergence
        self.kimi_dir, self.max_new_tokens = kimi_tokenizer_dir, max_new_tokens
        self.budget = {"max_new_tokens": max_new_tokens, "min_new_tokens": 4, "reserve_tokens": 2}
        self.record = tmp_path / "record.jsonl"
        self.tokenize(rows)

    def tokenize(self, rows):
        self.prompts, self.model = self.make_prompts(
            rows,
            max_new_tokens=self.max_new_tokens,
            turns=self.turns,
            tool_divergence=self.tool_divergence,
            tokenizer=str(self.kimi_dir),
            **KIMI,
        )

    @staticmethod
    def engine(url):
        return defaults("engine", kind="external", external={"urls": [url]})

    def generate(self, url, name="gen"):
        out = self.tmp_path / f"{name}.parquet"
        generate(
            prompts=self.prompts,
            shard_generations=out,
            server_log=self.tmp_path / "server.log",
            category="cat",
            shard=0,
            model=self.model,
            sampling=SAMPLING,
            engine=self.engine(url),
            budget=self.budget,
            client=CLIENT,
            max_failed_share=0.0,
            cache_dir=str(self.tmp_path / "cache"),
            shards=1,
        )
        return out


def engine(kimi_tokenizer_dir, record, **kwargs):
    backend = ScriptedBackend(str(kimi_tokenizer_dir), tool_rate=1.0, ramble_rate=0.0, **kwargs)
    return running_engine(backend, record=record)


def by_turn(rows):
    return {(r["id"], r["sample_index"], r["turn"]): r for r in rows}


def test_turn_ends_follow_the_user_and_tool_messages_an_assistant_answers():
    chat = CONVERSATIONS[0]["messages"]
    assert turn_ends(chat, "all") == [1, 3, 5, 7] and turn_ends(chat, "last") == [7]
    weather = CONVERSATIONS[1]["messages"]
    assert turn_ends(weather, "all") == [1, 3, 5, 7]  # after the user, after the tool result, ...
    greeting = [{"role": "system", "content": "s"}, assistant("Welcome!"), user("Hi")]
    assert turn_ends(greeting, "all") == [3]  # an assistant before any user message is history
    with pytest.raises(ValueError, match="turns must be one of"):
        turn_ends(chat, "first")


def test_tool_results_are_spliced_only_onto_the_same_calls():
    original = [assistant("", [call("get_weather", 0), call("web_search", 1)])]
    results = [tool("functions.get_weather:0", "-3"), tool("functions.web_search:1", "A"), user("ok")]
    same = assistant("", [call("get_weather", 7, '{"city": "Bergen"}'), call("web_search", 8)])
    spliced, why = splice_tool_results(original, same, results)
    assert why is None and [m.get("tool_call_id") for m in spliced] == [
        "functions.get_weather:7",
        "functions.web_search:8",
        None,
    ]
    assert [m["content"] for m in spliced] == ["-3", "A", "ok"]  # the original results, in order
    reordered = assistant("", [call("web_search", 0), call("get_weather", 1)])
    assert "tool mismatch" in splice_tool_results(original, reordered, results)[1]
    assert "tool mismatch" in splice_tool_results(original, assistant("No tools."), results)[1]
    fewer = assistant("", [call("get_weather", 0)])
    assert "tool mismatch" in splice_tool_results(original, fewer, results)[1]
    # A call the original conversation has no results for ends it too.
    _, why = splice_tool_results([assistant("plain")], same, [user("next")])
    assert "not with their results" in why
    assert splice_tool_results([assistant("plain")], assistant("mine"), [user("next")]) == ([user("next")], None)


def test_every_turn_is_regenerated_on_the_models_own_answers(tmp_path, make_prompts, kimi_tokenizer_dir, kimi_tok):
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir)
    with engine(kimi_tokenizer_dir, run.record) as url:
        out = run.generate(url)
    rows = read_rows(out)
    record = {label(e["rid"]): e for e in served(run.record) if e["status"] == 200}
    rows_of = by_turn(rows)
    # One row per (id, sample, turn), in prompt order, every turn accounted for.
    assert [(r["id"], r["turn"]) for r in rows] == [
        *(("chat", t) for t in range(4)),
        *(("weather", t) for t in range(4)),
        *(("search", t) for t in range(2)),
        ("single", 0),
    ]
    assert all(rows_of[("chat", 0, t)]["status"] == "ok" for t in range(4))

    layer = ChatLayer(kimi_tok, ModelProfile.from_config(run.model))
    for r in rows:
        if r["status"] != "ok":
            continue
        sent = record[f"{r['id']}.0" + (f".t{r['turn']}" if r["turn"] else "")]
        # The row holds exactly the ids the engine was sent and generated for this turn.
        assert sent["input_ids"] == r["prompt_ids"] and sent["output_ids"] == r["output_ids"]
        prompt_text = kimi_tok.decode(r["prompt_ids"], skip_special_tokens=False)
        assert ORIGINAL not in prompt_text  # no original assistant answer is ever in a prompt
        if r["turn"] == 0:
            continue
        before = rows_of[(r["id"], 0, r["turn"] - 1)]
        # The answer to the turn before, decoded and parsed as a chat layer does, is in this prompt
        # as the template renders it, and in the row's history as that message.
        message = layer.answer_message(
            before["output_ids"], before["finish_type"], json.loads(before["tools"] or "null"), []
        )
        history = json.loads(r["messages"])
        answers = [m for m in history if m["role"] == "assistant"]
        assert answers[-1]["content"] == message["content"] and message["content"].strip()
        assert message["content"] in prompt_text
        assert [m["content"] for m in history if m["role"] == "user"] == [
            m["content"] for m in CONVERSATIONS_BY_ID[r["id"]] if m["role"] == "user"
        ][: len([m for m in history if m["role"] == "user"])]

    # The tool call of the regenerated turn 0 gets the original result, under its own call id.
    weather1 = json.loads(rows_of[("weather", 0, 1)]["messages"])
    regenerated_call = weather1[-2]["tool_calls"][0]
    assert weather1[-1] == {"role": "tool", "tool_call_id": regenerated_call["id"], "content": '{"temp_c": -3}'}
    # Turn 1 of weather calls the tool again where the original answered in text: the conversation
    # ends there, turns 2 and 3 are skipped rows with the reason, the earlier turns stay.
    assert rows_of[("weather", 0, 1)]["status"] == "ok"
    for turn in (2, 3):
        assert rows_of[("weather", 0, turn)]["status"] == "skipped"
        assert "not with their results" in rows_of[("weather", 0, turn)]["error"]
    # The model calls get_weather where the original called web_search: the results do not answer it.
    assert rows_of[("search", 0, 1)]["status"] == "skipped" and "tool mismatch" in rows_of[("search", 0, 1)]["error"]

    # The checks accept every turn row: each prompt is a fresh render of its own history.
    report = check_sequences(generations=out, sequence_report=tmp_path / "seq.json", model=run.model)
    assert report.checked == sum(r["status"] == "ok" for r in rows) and not report.n_violations
    # A history holding another answer than the model's (the original one, say) is caught.
    tampered = [dict(r) for r in rows]
    chat1 = next(r for r in tampered if (r["id"], r["turn"]) == ("chat", 1))
    history = json.loads(chat1["messages"])
    history[1] = {"role": "assistant", "content": f"{ORIGINAL} 1"}
    chat1["messages"] = json.dumps(history)
    caught = check_rows(tampered, tokenizer=kimi_tok, profile=ModelProfile.from_config(run.model))
    assert {v["rule"] for v in caught.violations} >= {"history_holds_answers"}
    flagged = {(v["id"], v["turn"]) for v in caught.violations if v["rule"] == "history_holds_answers"}
    assert ("chat", 1) in flagged and {row_id for row_id, _ in flagged} == {"chat"}  # and turn 2, built on it
    verdicts = check_parsers(
        generations=out, verdicts=tmp_path / "v.parquet", verdict_counts=tmp_path / "v.json", model=run.model
    )
    assert verdicts["verdicts"]["total"] == report.checked

    # Exported with merge_turns: the loss tokens of every row are the engine's outputs of its turns.
    export_dataset(
        generations=out,
        dataset=tmp_path / "ds.jsonl",
        dataset_parquet=tmp_path / "ds.parquet",
        rejected=tmp_path / "rej.jsonl",
        export={"merge_turns": True},
    )
    exported = [json.loads(line) for line in (tmp_path / "ds.jsonl").read_text().splitlines()]
    merged = read_provenance(tmp_path / "ds.parquet")
    assert merged["turns_merged"] >= 1  # the weather tool chain: turn 1's prompt extends turn 0's sequence
    assert sum(r["turns"] for r in exported) == sum(r["status"] == "ok" for r in rows)
    for d in exported:
        outputs = [rows_of[(d["id"], 0, t)]["output_ids"] for t in range(d["turn"], d["turn"] + d["turns"])]
        assert [t for t, m in zip(d["input_ids"], d["loss_mask"]) if m] == [t for o in outputs for t in o]
        last = rows_of[(d["id"], 0, d["turn"] + d["turns"] - 1)]
        assert d["input_ids"] == last["prompt_ids"] + last["output_ids"]


CONVERSATIONS_BY_ID = {c["id"]: c["messages"] for c in CONVERSATIONS}


def test_reruns_send_only_turns_whose_history_changed(tmp_path, make_prompts, kimi_tokenizer_dir):
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir)
    with engine(kimi_tokenizer_dir, run.record) as url:
        first = read_rows(run.generate(url))
        sent_first = len(served(run.record))
        # rm -r results: the journal answers every turn, nothing is sent.
        again = read_rows(run.generate(url, "again"))
        assert len(served(run.record)) == sent_first and again == first
        # Edit the user message of chat's turn 2: only chat's turns 2 and 3 are sent again.
        edited = json.loads(json.dumps(CONVERSATIONS))
        edited[0]["messages"][4]["content"] = "Tell me a riddle instead."
        run.tokenize(edited)
        builder = make_builder(
            read_provenance(run.prompts), ModelProfile.from_config(run.model), SAMPLING, run.engine(url), run.budget
        )
        with open_journal(tmp_path / "cache", "cat", 0, 1, read_only=True) as journal:
            plan = make_plan(read_rows(run.prompts), builder, journal)
        assert (plan.to_send, plan.later_turns) == (1, 1)  # turn 2 known, turn 3 only once 2 is answered
        third = read_rows(run.generate(url, "edited"))
    resent = [label(e["rid"]) for e in served(run.record)[sent_first:]]
    assert sorted(resent) == ["chat.0.t2", "chat.0.t3"]
    unchanged = [k for k in by_turn(first) if k[0] != "chat" or k[2] < 2]
    assert all(by_turn(third)[k] == by_turn(first)[k] for k in unchanged)


def test_a_cut_answer_ends_its_conversation_and_keeps_the_turn(tmp_path, make_prompts, kimi_tokenizer_dir):
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir, max_new_tokens=5, rows=CONVERSATIONS[:1])
    with engine(kimi_tokenizer_dir, run.record) as url:
        rows = read_rows(run.generate(url))
    assert [(r["turn"], r["status"]) for r in rows] == [(0, "ok"), (1, "skipped"), (2, "skipped"), (3, "skipped")]
    assert rows[0]["finish_type"] == "length" and len(rows[0]["output_ids"]) == 5
    assert all("turn 0 was cut at max_new_tokens" in r["error"] for r in rows[1:])
    assert len(served(run.record)) == 1


def test_a_next_prompt_that_does_not_fit_ends_the_conversation(kimi_tokenizer_dir, kimi_tok):
    profile = ModelProfile.from_config(defaults("model", **{**KIMI, "tokenizer": str(kimi_tokenizer_dir)}))
    from eagle3_datagen.steps.tokenize_prompts import build_prompt_rows
    from eagle3_datagen.storage.prompt_rows import normalize_row
    from eagle3_datagen.tokens.templating import ChatTokenizer

    row = normalize_row(CONVERSATIONS[0], source="f.jsonl:1")
    prompt_row = build_prompt_rows(
        [row],
        ChatTokenizer(kimi_tok, profile),
        profile=profile,
        budget=Budget(16, 4, 2),
        category="c",
        turns="all",
    )[0]
    facts = {"tokenizer_sha256": "", "chat_template_sha256": "", "vocab_size": len(kimi_tok), "stop_token_ids": [1]}
    tight = ModelProfile.from_config(
        defaults(
            "model",
            **{**KIMI, "tokenizer": str(kimi_tokenizer_dir), "context_length": prompt_row["n_prompt_tokens"] + 24},
        )
    )
    builder = make_builder(
        facts, tight, SAMPLING, Run.engine("x"), {"max_new_tokens": 16, "min_new_tokens": 4, "reserve_tokens": 2}
    )
    builder.tokenizer = kimi_tok
    conversation = builder.start(prompt_row)
    answer = kimi_tok.encode("ok</think>" + "A long answer. " * 20, add_special_tokens=False) + [
        kimi_tok.convert_tokens_to_ids("<|im_end|>")
    ]
    assert conversation.advance({"status": "ok", "output_ids": answer, "finish_type": "stop"}) is None
    assert "turn 1 does not fit the context" in conversation.end_reason and "3 turn(s)" in conversation.end_reason


def test_a_rid_names_its_row_and_turn_whatever_the_id():
    from eagle3_datagen.generation.requests import Request, parse_rid

    cases = (("a.1", 0, 0), ("x", 2, 3), ("x.0.t2", 0, 0), ("a.t5", 1, 1), ("7", 0, 12), ("a@b.1", 0, 2))
    for row_id, sample, turn in cases:
        for mode in ("default", "instant", "think-hi_2"):
            req = Request(row_id, sample, [1], 4, 0, turn=turn, mode=mode)
            sent = parse_rid(req.rid("9f3a", 2))
            assert sent == ((row_id, sample, turn, mode), "9f3a", 2)
            assert (sent.row, sent.nonce, sent.attempt) == (req.key, "9f3a", 2)
    # One conversation in two modes: two requests, two rids.
    assert Request("x", 0, [1], 4, 0, mode="thinking").label != Request("x", 0, [1], 4, 0, mode="instant").label


def test_an_answer_that_cannot_continue_ends_only_its_conversation(kimi_tokenizer_dir, kimi_tok):
    profile = ModelProfile.from_config(defaults("model", **{**KIMI, "tokenizer": str(kimi_tokenizer_dir)}))
    facts = {"tokenizer_sha256": "", "chat_template_sha256": "", "vocab_size": len(kimi_tok), "stop_token_ids": [1]}
    budget = {"max_new_tokens": 16, "min_new_tokens": 4, "reserve_tokens": 2}
    builder = make_builder(facts, profile, SAMPLING, Run.engine("x"), budget)

    class Broken(ChatLayer):
        def answer_message(self, *args):
            raise KeyError("no such thing")

    builder.tokenizer, builder._layers[profile.mode] = kimi_tok, Broken(kimi_tok, profile)
    row = {
        "id": "c",
        "sample_index": 0,
        "seed": 1,
        "messages": json.dumps(CONVERSATIONS[0]["messages"]),
        "tools": "",
        "turn_ends": [1, 3, 5, 7],
        "prompt_ids": [1, 2],
        "max_new_tokens": 16,
    }
    conversation = builder.start(row)
    assert conversation.advance({"status": "ok", "output_ids": [5, 6], "finish_type": "stop"}) is None
    assert "turn 1 could not be made from turn 0's answer: KeyError" in conversation.end_reason
    # A tokenizer that is not the one the prompts were made with fails the job instead.
    strict = make_builder({**facts, "tokenizer_sha256": "0" * 64}, profile, SAMPLING, Run.engine("x"), budget)
    with pytest.raises(RuntimeError, match="is not the one the prompts were tokenized with"):
        strict.start(row).advance({"status": "ok", "output_ids": [5, 6], "finish_type": "stop"})


def test_turns_last_regenerates_only_the_last_turn_on_the_original_history(
    tmp_path, make_prompts, kimi_tokenizer_dir, kimi_tok
):
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir, rows=CONVERSATIONS[:1], turns="last")
    with engine(kimi_tokenizer_dir, run.record) as url:
        rows = read_rows(run.generate(url))
    assert [(r["id"], r["turn"], r["status"]) for r in rows] == [("chat", 0, "ok")]
    assert read_rows(run.prompts)[0]["turn_ends"] == [7]
    text = kimi_tok.decode(rows[0]["prompt_ids"], skip_special_tokens=False)
    assert text.count(ORIGINAL) == 3 and json.loads(rows[0]["messages"]) == CONVERSATIONS[0]["messages"]
    assert [label(e["rid"]) for e in served(run.record)] == ["chat.0"]


def test_an_empty_turn_ends_the_conversation_there(tmp_path, make_prompts, kimi_tokenizer_dir):
    """An empty message ends a conversation, not erases it: the turns before it are made, each turn
    whose history holds it is a skipped row naming it; one in the first turn's history skips them all."""
    gap = json.loads(json.dumps(CONVERSATIONS[0]))
    gap["id"], gap["messages"][3]["content"] = "gap", " "  # the answer to turn 1 was never written
    lost = {"id": "lost", "messages": [user(""), assistant("a"), user("b")]}
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir, rows=[gap, lost])
    with engine(kimi_tokenizer_dir, run.record) as url:
        rows = read_rows(run.generate(url))
    assert [(r["id"], r["turn"], r["status"]) for r in rows] == [
        ("gap", 0, "ok"),
        ("gap", 1, "ok"),
        ("gap", 2, "skipped"),
        ("gap", 3, "skipped"),
        ("lost", 0, "skipped"),
        ("lost", 1, "skipped"),
    ]
    assert all("message 3 of the conversation (assistant) is empty" in r["error"] for r in rows[2:4])
    assert "field 'messages[0].content': empty content" in rows[4]["error"]
    assert "turn 0 was not sent" in rows[5]["error"] and "empty content" in rows[5]["error"]
    assert sorted(label(e["rid"]) for e in served(run.record)) == ["gap.0", "gap.0.t1"]


def test_a_diverged_tool_call_gives_its_later_turns_on_the_original_history(
    tmp_path, make_prompts, kimi_tokenizer_dir, kimi_tok
):
    """tool_divergence: original. Where the model's calls differ from the original's, the original
    message and its results stand in its place, the later turns are made on that history, and each
    row says which history it was rendered on; the checks accept exactly that."""
    run = Run(tmp_path, make_prompts, kimi_tokenizer_dir, rows=CONVERSATIONS[1:3], tool_divergence="original")
    assert read_provenance(run.prompts)["tool_divergence"] == "original"
    with engine(kimi_tokenizer_dir, run.record) as url:
        out = run.generate(url)
    rows = by_turn(read_rows(out))
    assert all(r["status"] == "ok" for r in rows.values()), [r["error"] for r in rows.values()]
    # weather: turn 1 calls the tool again where the original answered in text (the default ends the
    # conversation there); its original answer stands in turn 2's history, and in turn 3's.
    assert [rows[("weather", 0, t)]["history"] for t in range(4)] == ["on_policy", "on_policy", "original", "original"]
    weather2 = json.loads(rows[("weather", 0, 2)]["messages"])
    assert weather2[-2:] == [assistant(f"{ORIGINAL} cold"), user("And tomorrow?")]
    assert f"{ORIGINAL} cold" in kimi_tok.decode(rows[("weather", 0, 2)]["prompt_ids"], skip_special_tokens=False)
    # search: the model calls get_weather where the original called web_search: the original call and
    # its result make turn 1's history.
    assert rows[("search", 0, 1)]["history"] == "original"
    search1 = json.loads(rows[("search", 0, 1)]["messages"])
    assert search1[1:] == CONVERSATIONS_BY_ID["search"][1:]
    report = check_sequences(generations=out, sequence_report=tmp_path / "seq.json", model=run.model)
    assert report.checked == len(rows) and not report.n_violations
    # A row that claims an on-policy history while holding an original answer is caught.
    tampered = [dict(r, history="on_policy") if r["history"] == "original" else r for r in read_rows(out)]
    caught = check_rows(tampered, tokenizer=kimi_tok, profile=ModelProfile.from_config(run.model))
    flagged = {(v["id"], 0, v["turn"]) for v in caught.violations}
    assert {("weather", 0, 2), ("search", 0, 1)} <= flagged
    assert all(rows[key]["history"] == "original" for key in flagged)
