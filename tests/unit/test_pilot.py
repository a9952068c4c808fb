"""The pilot: a seeded sample generated into the cache, and a projection of the full run that the
full run then meets (in-process, against the scripted engine with a latency)."""

import json
import logging
import math

import pytest

from conftest import conversations, tokenize_file
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.engine.server import Faults
from eagle3_datagen.generation.projection import category_rows, project, wilson_interval
from eagle3_datagen.generation.requests import parse_rid
from eagle3_datagen.quality.flags import CODES, LOOP_FINISH, QualityFacts, QualitySettings
from eagle3_datagen.quality.loops import LoopSettings
from eagle3_datagen.settings import defaults
from eagle3_datagen.steps.generate import generate
from eagle3_datagen.steps.pilot import COUNTED, pilot_generate, project_pilot, row_quality, sample_keys
from eagle3_datagen.storage.tables import GENERATIONS_SCHEMA, TableWriter, read_rows
from engine_thread import running_engine

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CLIENT = {"concurrency": 8, "max_retries": 1, "backoff_initial_s": 0.01, "backoff_max_s": 0.02}
BUDGET = {"max_new_tokens": 96, "min_new_tokens": 4, "reserve_tokens": 2}
PILOT = {"fraction": 0.1, "min_rows": 30}


def talks(n):
    """Conversations of 1 to 3 user turns (the original answers in between are replaced)."""
    rows = conversations(n)
    for i, row in enumerate(rows):
        for k in range(i % 3):
            row["messages"] += [
                {"role": "assistant", "content": "An answer."},
                {"role": "user", "content": f"And {k}?"},
            ]
    return rows


def served(record):
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_sample_is_seeded_and_at_least_min_rows(make_prompts):
    prompts, _ = make_prompts(conversations(50) + [{"id": "bad"}])
    keys, usable = sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=3)
    assert usable == {"default": 50} and len(keys) == 8
    assert sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=3)[0] == keys  # reproducible
    assert sample_keys(prompts, {"fraction": 0.1, "min_rows": 8}, seed=4)[0] != keys
    assert len(sample_keys(prompts, {"fraction": 0.5, "min_rows": 8}, seed=3)[0]) == 25
    assert len(sample_keys(prompts, {"fraction": 0.5, "min_rows": 80}, seed=3)[0]) == 50  # all it has


def test_the_interval_follows_the_spread_and_vanishes_for_a_census():
    sample = [{"requests": 1, "prompt_tokens": 10, "output_tokens": v, "truncated": 0, "dataset_bytes": 1,
               "generations_bytes": 1} for v in (10, 20, 30, 40)]  # fmt: skip
    total, half = project(sample, 100)["output_tokens"]
    assert total == 2500 and half == pytest.approx(1.96 * math.sqrt(12.91**2 / 4 * 96 / 99) * 100, rel=0.01)
    assert project(sample, 4)["output_tokens"] == (100, 0.0)  # the sample is the category


def test_the_projection_meets_the_full_run_and_the_pilot_is_not_paid_twice(
    make_prompts, qwen3_tokenizer_dir, tmp_path, caplog
):
    caplog.set_level(logging.INFO)  # as a job's logging is set up
    prompts, model = make_prompts(talks(240), max_new_tokens=BUDGET["max_new_tokens"], turns="all")
    record = tmp_path / "record.jsonl"
    backend = ScriptedBackend(str(qwen3_tokenizer_dir))
    with running_engine(backend, faults=Faults(latency_ms=(5, 40), seed=1), record=record) as url:
        engine = defaults("engine", kind="external", external={"urls": [url]})
        common = dict(model=model, sampling=SAMPLING, engine=engine, budget=BUDGET, client=CLIENT)
        run = pilot_generate(
            prompts=prompts,
            pilot_generations=tmp_path / "pilot" / "cat.parquet",
            pilot_run=tmp_path / "pilot" / "cat.json",
            pilot_server_log=tmp_path / "pilot.log",
            category="cat",
            cache_dir=str(tmp_path / "cache"),
            pilot=PILOT,
            seed=7,
            **common,
        )
        [row] = project_pilot(
            categories=["cat"],
            pilot_generations=[tmp_path / "pilot" / "cat.parquet"],
            pilot_run=[tmp_path / "pilot" / "cat.json"],
            projection=tmp_path / "projection.tsv",
            projection_png=tmp_path / "projection.png",
        )
        pilot_requests = [parse_rid(e["rid"])[0] for e in served(record)]
        generate(
            prompts=prompts,
            shard_generations=tmp_path / "full.parquet",
            server_log=tmp_path / "server.log",
            category="cat",
            shard=0,
            max_failed_share=0.0,
            cache_dir=str(tmp_path / "cache"),
            shards=1,
            client=CLIENT,
            **{k: v for k, v in common.items() if k != "client"},
        )
    assert run["sampled"] == 30 and run["usable_conversations"] == 240 and run["client"]["requests"] > 30
    # Like a generate job, the pilot keeps its attempt's own logs beside its declared one.
    [pilot_attempt] = [p for p in (tmp_path / "attempts").iterdir() if p.name.startswith("pilot.")]
    assert "attempt on" in pilot_attempt.read_text() and "(pilot) plan" in pilot_attempt.read_text()
    # The pilot's answers are in the cache: the full run sends every other turn, and none of the pilot's.
    full_requests = [parse_rid(e["rid"])[0] for e in served(record)][len(pilot_requests) :]
    assert not set(full_requests) & set(pilot_requests)
    rows = read_rows(tmp_path / "full.parquet")
    sent = [r for r in rows if r["status"] in ("ok", "failed")]
    assert len(sent) == len(pilot_requests) + len(full_requests)
    # The full run falls inside the projection's stated 95 % intervals.
    actual_tokens = sum(len(r["output_ids"]) for r in sent)
    assert abs(actual_tokens - row["output_tokens"]) <= row["output_tokens_ci95"], (actual_tokens, row)
    assert abs(len(sent) - row["requests"]) <= row["requests_ci95"], (len(sent), row)
    assert 0 < row["output_tokens_ci95"] < 0.5 * row["output_tokens"]  # a real interval, not a blank cheque
    assert row["server_hours"] > 0 and row["gpu_hours"] is None  # an external server: its GPUs are not known
    # Whichever way the pilot ran, stopping loops live costs no more than what it made, and not stopping them no less.
    assert row["output_tokens_live_stop"] <= row["output_tokens"] <= row["output_tokens_no_live_stop"]
    assert row["pilot_rows"] == sum(r["status"] == "ok" for r in read_rows(tmp_path / "pilot" / "cat.parquet"))
    for code in CODES:
        assert row[f"{code}_low"] <= row[f"{code}_share"] <= row[f"{code}_high"], code
    table = (tmp_path / "projection.tsv").read_text().splitlines()
    assert table[0].split("\t")[:5] == ["category", "mode", "conversations", "sampled", "requests"]
    assert [line.split("\t")[:2] for line in table[1:]] == [["cat", "default"], ["total", "default"]]
    assert run["usable_by_mode"] == {"default": 240} and run["sampled_by_mode"] == {"default": 30}
    assert (tmp_path / "projection.png").stat().st_size > 0


def test_the_wilson_interval_meets_its_formula_and_its_edges():
    z = 1.96
    # 0 of n: [0, z²/(n+z²)]; n of n: [n/(n+z²), 1] (the score interval's closed forms at the edges).
    assert wilson_interval(0, 10) == (0.0, pytest.approx(z * z / (10 + z * z)))
    assert wilson_interval(10, 10) == (pytest.approx(10 / (10 + z * z)), 1.0)
    # 5 of 10: symmetric about 1/2, half-width z/(1+z²/n)·sqrt(p(1-p)/n + z²/4n²).
    half = z / (1 + z * z / 10) * math.sqrt(0.25 / 10 + z * z / 400)
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert 0.23 < low < 0.24 and 0.76 < high < 0.77  # the published 0.2366-0.7634
    # It narrows with n, always holds the share, and says nothing is known of an empty sample.
    assert wilson_interval(50, 100)[1] - wilson_interval(50, 100)[0] < high - low
    for k, n in ((1, 7), (3, 40), (39, 40)):
        lo, hi = wilson_interval(k, n)
        assert 0.0 <= lo < k / n < hi <= 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(3, 40, z=2.576)[0] < wilson_interval(3, 40)[0]  # 99 % is wider
    for bad in ((-1, 5), (6, 5), (0, -1)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


# Kimi-shaped ids: the generation prompt opens the reasoning; a turn ends with <|im_end|>, and the
# server also stops on an [EOS] that is no turn end.
THINK, END_THINK, IM_END, EOS, SPACE = 163606, 163607, 163586, 163585, 220
TOKEN_FACTS = {
    "stop_token_ids": [IM_END],
    "stop_set": {"ids": [IM_END, EOS]},
    "reasoning_start_id": THINK,
    "reasoning_end_id": END_THINK,
    "whitespace_ids": [SPACE],
}
PROMPT = [1000, 1001, THINK]


def pilot_rows(stream_interval):
    """One conversation per case: (row, output tokens with the live loop stop, without it, flag codes)."""
    onset, period = 10, 3  # a loop of period 3 from output token 10: detected at 10 + need(3) tokens
    need = LoopSettings().need(period)
    cases = [
        ([50, 51, END_THINK, 60, 61, IM_END], "stop", 64, None, None, []),
        (list(range(100, 100 + onset)) + [1, 2, 3] * 130, "length", 400, onset + need + stream_interval, 400,
         ["repetition_loop", "unfinished_reasoning"]),
        (list(range(200, 220)) + [7, 8] * 140, LOOP_FINISH, 1000, None, 1000,
         ["repetition_loop", "unfinished_reasoning"]),
        ([50, END_THINK, SPACE, IM_END], "stop", 64, None, None, ["empty_answer"]),
        ([50, END_THINK, 60, EOS], "stop", 64, None, None, ["unexpected_stop"]),
    ]  # fmt: skip
    out = []
    for i, (output, finish, budget, with_stop, without_stop, codes) in enumerate(cases):
        row = {"id": f"c{i}", "sample_index": 0, "turn": 0, "category": "cat", "messages": "[]", "tools": "",
               "prompt_ids": PROMPT, "output_ids": output, "finish_type": finish, "max_new_tokens": budget,
               "status": "ok", "seed": i}  # fmt: skip
        out.append((row, with_stop or len(output), without_stop or len(output), codes))
    return out


def test_each_row_has_its_flags_and_its_cost_with_and_without_the_live_stop():
    quality = QualitySettings.from_config({"stream_interval": 16})
    facts = QualityFacts.from_token_facts(TOKEN_FACTS)
    for row, with_stop, without_stop, codes in pilot_rows(16):
        assert row_quality(row, facts, quality) == (codes, with_stop, without_stop), row["id"]
    # A loop seen near the end of its answer costs no more than the answer did.
    row = pilot_rows(16)[1][0] | {"output_ids": list(range(100, 110)) + [1, 2, 3] * 88}
    assert row_quality(row, facts, quality)[1:] == (274, 274)


def test_the_projection_gives_the_flags_shares_and_the_hours_with_and_without_the_live_stop(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    cases = pilot_rows(16)
    generations = tmp_path / "pilot" / "cat.parquet"
    with TableWriter(generations, GENERATIONS_SCHEMA) as writer:
        writer.write(row for row, *_ in cases)
        writer.close({"prompts": TOKEN_FACTS})
    # 1/3.6 output tokens a second on 2 GPUs: a GPU-hour per 500 tokens.
    run = {"usable_conversations": len(cases), "client": {"output_tokens": 1, "elapsed_s": 3.6, "concurrency": 8},
           "server_gpus": 2, "journal_bytes": 0}  # fmt: skip
    (tmp_path / "pilot" / "cat.json").write_text(json.dumps(run))
    [row] = project_pilot(
        categories=["cat"],
        pilot_generations=[generations],
        pilot_run=[tmp_path / "pilot" / "cat.json"],
        projection=tmp_path / "projection.tsv",
        projection_png=tmp_path / "projection.png",
        quality={"stream_interval": 16},
    )
    with_stop, without_stop = (sum(case[k] for case in cases) for k in (1, 2))
    assert row["output_tokens_live_stop"] == with_stop and row["output_tokens_no_live_stop"] == without_stop
    assert row["gpu_hours_live_stop"] == pytest.approx(with_stop / 500, abs=1e-3)
    assert row["gpu_hours_no_live_stop"] == pytest.approx(without_stop / 500, abs=1e-3)
    assert row["gpu_hours"] == pytest.approx(row["output_tokens"] / 500, abs=1e-3)  # the same conversion
    assert row["gpu_hours_live_stop"] < row["gpu_hours"] < row["gpu_hours_no_live_stop"]  # the pilot ran half and half
    assert row["pilot_rows"] == len(cases)
    for code in CODES:
        k = sum(code in case[3] for case in cases)
        assert row[f"{code}_rows"] == k and row[f"{code}_share"] == pytest.approx(k / len(cases))
        low, high = wilson_interval(k, len(cases))
        assert (row[f"{code}_low"], row[f"{code}_high"]) == (
            pytest.approx(low, abs=1e-4),
            pytest.approx(high, abs=1e-4),
        )
    header, cat, total = (line.split("\t") for line in (tmp_path / "projection.tsv").read_text().splitlines())
    table = {name: (a, b) for name, a, b in zip(header, cat, total)}
    assert table["repetition_loop_share"][0] == table["repetition_loop_share"][1] == str(row["repetition_loop_share"])
    assert table["gpu_hours_no_live_stop"][1] == str(row["gpu_hours_no_live_stop"])
    assert "cat quality flags among 5 pilot rows: repetition_loop 2 (40.0 %" in caplog.text


# The demo's Kimi-shaped profile with its two serving modes (config/config.yaml).
KIMI_MODES = {
    "name": "kimi-shaped-test",
    "context_length": 4096,
    "reasoning_end": "</think>",
    "stop_tokens": ["<|im_end|>"],
    "prompt_only_tokens": ["<think>"],
    "reasoning_parser": "kimi_k2",
    "tool_call_parser": "kimi_k2",
    "modes": {
        "thinking": {"chat_template_kwargs": {"thinking": True}, "prompt_suffix": ["<think>"]},
        "instant": {"chat_template_kwargs": {"thinking": False}, "prompt_suffix": ["<think>", "</think>"]},
    },
}


def tokenized(tmp_path, category, rows, model, modes):
    source = tmp_path / f"{category}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = tmp_path / "prompts" / f"{category}.parquet"
    return tokenize_file(source, prompts, model, category=category, budget=BUDGET, seed=7, turns="all", mode_mix=modes)


def test_a_category_that_mixes_modes_is_projected_per_mode_and_in_all(tmp_path, kimi_tokenizer_dir, caplog):
    caplog.set_level(logging.INFO)
    model = defaults("model", **KIMI_MODES, tokenizer=str(kimi_tokenizer_dir))
    sampling = {"thinking": SAMPLING, "instant": {**SAMPLING, "temperature": 0.6}}
    # math mixes the modes; chat has none in its cell: the profile's first mode only.
    categories = {"math": ("thinking:0.6,instant:0.4", talks(90) + [{"id": "bad"}]), "chat": (None, talks(40))}
    prompts = {c: tokenized(tmp_path, c, rows, model, modes) for c, (modes, rows) in categories.items()}

    def pilot(category, kind):
        return tmp_path / "pilot" / f"{category}.{kind}"

    with running_engine(ScriptedBackend(str(kimi_tokenizer_dir)), record=tmp_path / "record.jsonl") as url:
        engine = defaults("engine", kind="external", external={"urls": [url]})
        runs = {
            c: pilot_generate(
                prompts=prompts[c],
                pilot_generations=pilot(c, "parquet"),
                pilot_run=pilot(c, "json"),
                pilot_server_log=tmp_path / f"{c}.log",
                category=c,
                model=model,
                sampling=sampling,
                engine=engine,
                budget=BUDGET,
                client=CLIENT,
                cache_dir=str(tmp_path / "cache"),
                pilot=PILOT,
                seed=7,
            )  # fmt: skip
            for c in categories
        }
    returned = project_pilot(
        categories=list(categories),
        pilot_generations=[pilot(c, "parquet") for c in categories],
        pilot_run=[pilot(c, "json") for c in categories],
        projection=tmp_path / "projection.tsv",
        projection_png=tmp_path / "projection.png",
    )
    import pandas as pd

    frame = pd.read_csv(tmp_path / "projection.tsv", sep="\t")
    table = {(r["category"], r["mode"]): r for r in frame.to_dict("records")}
    assert list(frame.columns[:3]) == ["category", "mode", "conversations"]
    assert list(table) == [("math", "thinking"), ("math", "instant"), ("math", "all"), ("chat", "thinking"),
                           ("total", "thinking"), ("total", "instant"), ("total", "all")]  # fmt: skip
    assert [(r["category"], r["mode"]) for r in returned] == list(table)[:4]  # the categories' rows
    # Each mode's population is its usable rows in the prompts table; its sample, the pilot's rows of that mode.
    for (category, mode), row in table.items():
        if category == "total" or mode == "all":
            continue
        usable = [r for r in read_rows(prompts[category]) if r["status"] == "ok" and r["mode"] == mode]
        generated = [r for r in read_rows(pilot(category, "parquet")) if r["mode"] == mode]
        sample = {(r["id"], r["sample_index"]) for r in generated}
        assert row["conversations"] == len(usable) == runs[category]["usable_by_mode"][mode] > 0, (category, mode)
        assert row["sampled"] == len(sample) == runs[category]["sampled_by_mode"][mode] > 0, (category, mode)
        # Each mode is drawn on its own: its share of the sample, at least min_rows.
        wanted = max(PILOT["min_rows"], math.ceil(PILOT["fraction"] * len(usable)))
        assert len(sample) == min(len(usable), wanted), (category, mode)
        sent = [r for r in generated if r["status"] in ("ok", "failed")]
        for key, total in (("requests", len(sent)), ("output_tokens", sum(len(r["output_ids"]) for r in sent))):
            assert abs(row[key] - total / len(sample) * len(usable)) <= 0.5, (category, mode, key)
        assert row["pilot_rows"] == sum(r["status"] == "ok" for r in generated)
    assert runs["math"]["usable_conversations"] == 90 == sum(runs["math"]["usable_by_mode"].values())
    # A category's all row and the totals sum the rows they cover, their intervals in quadrature.
    covers = {
        ("math", "all"): [("math", "thinking"), ("math", "instant")],
        ("total", "thinking"): [("math", "thinking"), ("chat", "thinking")],
        ("total", "instant"): [("math", "instant")],
        ("total", "all"): [("math", "thinking"), ("math", "instant"), ("chat", "thinking")],
    }
    for name, parts in covers.items():
        rows = [table[p] for p in parts]
        for key in ("conversations", "sampled", "requests", "prompt_tokens", "output_tokens", "pilot_rows",
                    "output_tokens_live_stop", "repetition_loop_rows"):  # fmt: skip
            assert table[name][key] == sum(r[key] for r in rows), (name, key)
        assert table[name]["server_hours"] == pytest.approx(sum(r["server_hours"] for r in rows), abs=1e-3)
        ci = math.sqrt(sum(r["output_tokens_ci95"] ** 2 for r in rows))
        assert table[name]["output_tokens_ci95"] == round(ci), name  # a count: rounded as the rows are
    assert table["total", "all"]["requests"] == table["math", "all"]["requests"] + table["chat", "thinking"]["requests"]
    # Per-mode bars and log lines: "category (mode)".
    assert (tmp_path / "projection.png").stat().st_size > 0
    for label in ("math (instant)", "math (all)", "chat (thinking)", "total (instant)"):
        assert f"{label} quality flags among" in caplog.text, label
    assert f"total (instant): {table['total', 'instant']['conversations']} conversations, " in caplog.text
    math_run = runs["math"]
    assert f"math pilot: {math_run['sampled']} of 90 conversations (thinking" in caplog.text


def test_a_mode_the_pilot_drew_none_of_is_projected_from_the_whole_sample_and_says_so(caplog):
    def measure(tokens):
        return {"mode": "thinking", **dict.fromkeys(COUNTED, 0), "requests": 1, "output_tokens": tokens, "generated": 1}

    run = {"usable_conversations": 12, "usable_by_mode": {"thinking": 10, "instant": 2}, "client": None,
           "server_gpus": 1, "journal_bytes": 0}  # fmt: skip
    rows = category_rows("math", [measure(10), measure(30)], run)
    assert [(r["mode"], r["conversations"], r["sampled"]) for r in rows] == [
        ("thinking", 10, 2),
        ("instant", 2, 0),
        ("all", 12, 2),
    ]
    assert [r["output_tokens"] for r in rows] == [200, 40, 240]  # the sample's mean, 20 a conversation
    # Its flags are not known: no pilot rows, the whole interval.
    assert rows[1]["pilot_rows"] == 0 and rows[2]["pilot_rows"] == 2
    assert (rows[1]["repetition_loop_share"], rows[1]["repetition_loop_low"], rows[1]["repetition_loop_high"]) == (
        None,
        0.0,
        1.0,
    )
    assert "drew none of the 2 usable conversations of mode instant" in caplog.text
    # Each mode's row names its budget (model.modes.<mode>.max_new_tokens); a row over modes, where they share one.
    budget = {"max_new_tokens": 32768, "min_new_tokens": 16, "reserve_tokens": 2}
    for modes, expected in (({"instant": {"max_new_tokens": 4096}}, [32768, 4096, None]), ({}, [32768] * 3)):
        rows = category_rows("math", [measure(10), measure(30)], run | {"budget": {**budget, "modes": modes}})
        assert [r["max_new_tokens"] for r in rows] == expected
    # Rows of a mode the prompts table has no usable rows of are an error, not dropped.
    with pytest.raises(ValueError, match="no usable rows"):
        category_rows(
            "math", [measure(10), {**measure(5), "mode": "instant"}], run | {"usable_by_mode": {"thinking": 12}}
        )
