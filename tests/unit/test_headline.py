"""The run's headline: rows kept and left out, tokens, hours and parser checks, per category and mode."""

import json
from html.parser import HTMLParser

import pyarrow as pa
import pytest

from eagle3_datagen.quality.flags import CODES
from eagle3_datagen.steps.headline import (
    compute_text,
    count,
    headline,
    headline_values,
    hours,
    job_usage,
    percent,
    read_table,
    render,
    verdict_mix,
)
from eagle3_datagen.steps.summarize import NORMALIZATION, write_summary
from eagle3_datagen.storage.tables import write_table


def summary_row(category, mode, *, ok, skipped=0, failed=0, filtered=0, prompt=0, output=0, truncated=0.0, **quar):
    """A summary row as summarize writes it (`quar`: quarantined rows per quality code)."""
    return {
        "category": category,
        "mode": mode,
        "rows": ok + skipped + failed + filtered,
        "ok": ok,
        "skipped": skipped,
        "failed": failed,
        "filtered": filtered,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "mean_output_tokens": round(output / ok, 1) if ok else 0.0,
        "truncated_share": truncated,
        **{f"flag_{code}": quar.get(code, 0) for code in CODES},
        **{f"quarantined_{code}": quar.get(code, 0) for code in CODES},
        "turns_merged": 0,
        "turns_not_merged": 0,
        "why_not_merged": "",
        **{kind: 0 for kind in NORMALIZATION},
    }


# math mixes two modes (its own rows and its whole row, mode `all`), chat has one.
MATH = {
    "thinking": dict(ok=40, skipped=2, filtered=3, prompt=4000, output=9000, truncated=0.05, repetition_loop=3),
    "instant": dict(ok=20, failed=1, filtered=1, prompt=1800, output=700, truncated=0.0, empty_answer=1),
}
CHAT = dict(ok=30, skipped=5, filtered=2, prompt=3500, output=4100, truncated=0.1, repetition_loop=1, empty_answer=1)
CHECKS = {
    "math": {
        "reasoning_parser": "kimi_k2",
        "verdicts": {"exact": 50, "reasoning_dropped_by_template": 10, "other": 0, "total": 60},
        "verdicts_by_mode": {
            "instant": {"exact": 20, "reasoning_dropped_by_template": 0, "other": 0, "total": 20},
            "thinking": {"exact": 30, "reasoning_dropped_by_template": 10, "other": 0, "total": 40},
        },
    },
    "chat": {
        "reasoning_parser": "kimi_k2",
        "verdicts": {"exact": 27, "reasoning_dropped_by_template": 0, "other": 3, "total": 30},
        "verdicts_by_mode": {"thinking": {"exact": 27, "reasoning_dropped_by_template": 0, "other": 3, "total": 30}},
    },
}


def whole_math() -> dict:
    """math's whole row: its modes' counts added, the truncation share weighted by generated rows."""
    rows = [summary_row("math", m, **kw) for m, kw in MATH.items()]
    whole = summary_row("math", "all", ok=0)
    for key in ("rows", "ok", "skipped", "failed", "filtered", "prompt_tokens", "output_tokens"):
        whole[key] = sum(r[key] for r in rows)
    for code in CODES:
        whole[f"quarantined_{code}"] = sum(r[f"quarantined_{code}"] for r in rows)
    generated = [r["ok"] + r["filtered"] for r in rows]
    whole["truncated_share"] = round(sum(r["truncated_share"] * n for r, n in zip(rows, generated)) / sum(generated), 4)
    return whole


@pytest.fixture
def summary(tmp_path):
    rows = [summary_row("math", m, **kw) for m, kw in MATH.items()] + [
        whole_math(),
        summary_row("chat", "thinking", **CHAT),
    ]
    write_summary(rows, tmp_path / "summary.tsv")
    return tmp_path / "summary.tsv"


def sglang_shard(wall_s, requests, tp_size):
    engine = {"kind": "sglang", "sglang": {"model_path": "m", "tp_size": tp_size}}
    return {"client": {"requests": requests}, "params": {"engine": engine}, "job": {"wall_s": wall_s}}


def local_usage(wall_s):
    return job_usage(
        {
            "client": {"requests": 3},
            "params": {"engine": {"kind": "local", "local": {"gpus": 0}}},
            "job": {"wall_s": wall_s},
        }
    )


def test_every_category_and_mode_gets_its_rows_by_reason_its_tokens_and_its_checks(summary):
    values = headline_values(read_table(summary), CHECKS, {"math": local_usage(60), "chat": local_usage(30)})
    rows = {(r["category"], r["mode"]): r for r in values["rows"]}
    # A category's whole row first, then its modes; then the overall total, then the totals per mode.
    assert list(rows) == [
        ("math", "all"),
        ("math", "thinking"),
        ("math", "instant"),
        ("chat", "thinking"),
        ("total", "all"),
        ("total", "thinking"),
        ("total", "instant"),
    ]
    assert values["several_modes"]
    everything = [MATH["thinking"], MATH["instant"], CHAT]
    total = values["total"]
    assert total["kept"] == sum(kw["ok"] for kw in everything)
    for reason in ("skipped", "failed", "filtered"):
        assert total[reason] == sum(kw.get(reason, 0) for kw in everything)
    assert total["rows"] == total["kept"] + total["skipped"] + total["failed"] + total["filtered"]
    assert total["prompt_tokens"] == sum(kw["prompt"] for kw in everything)
    assert total["output_tokens"] == sum(kw["output"] for kw in everything)
    assert total["filtered_by"] == {"repetition_loop": 4, "empty_answer": 2}
    assert rows[("math", "instant")]["filtered_by"] == {"empty_answer": 1}
    assert rows[("math", "thinking")]["truncated_share"] == MATH["thinking"]["truncated"]
    # Checks: a mode's own verdicts on its row, the category's on its whole row, summed on the totals.
    assert rows[("math", "instant")]["verdicts"]["exact"] == 20
    assert rows[("math", "all")]["verdicts"]["reasoning_dropped_by_template"] == 10
    assert total["verdicts"] == {"exact": 77, "reasoning_dropped_by_template": 10, "other": 3}
    assert rows[("total", "thinking")]["verdicts"] == {"exact": 57, "reasoning_dropped_by_template": 10, "other": 3}
    # Hours on the whole rows only: the modes of a category were generated by the same jobs.
    assert rows[("math", "all")]["job_hours"] == pytest.approx(60 / 3600)
    assert total["job_hours"] == pytest.approx(90 / 3600) and total["gpu_hours"] == 0
    assert "job_hours" not in rows[("math", "thinking")]


def test_gpu_hours_are_each_jobs_time_times_the_gpus_it_held():
    # Three shards of one category: two sent on a 4-GPU server; one had nothing left to send (no server).
    usage = job_usage({"shards": [sglang_shard(1800, 10, 4), sglang_shard(3600, 5, 4), sglang_shard(5, 0, 4)]})
    assert usage["job_hours"] == pytest.approx((1800 + 3600) / 3600)
    assert usage["gpu_hours"] == pytest.approx((1800 + 3600) * 4 / 3600)
    total = {"job_hours": usage["job_hours"], "gpu_hours": usage["gpu_hours"], "projected_hours": None}
    assert f"{hours(usage['gpu_hours'])} GPU-hours" in compute_text(total, usage["engines"])
    # The CPU engine holds no GPU, an external server is not the job's.
    cpu = local_usage(120)
    text = compute_text(dict(cpu, projected_hours=None), cpu["engines"])
    assert "0 GPU-hours</strong> (CPU engine)" in text and f"{hours(120 / 3600)} job-hours" in text
    shard = {"client": {"requests": 2}, "params": {"engine": {"kind": "external"}}, "job": {"wall_s": 60}}
    external = job_usage(shard)
    assert external["gpu_hours"] == 0
    assert "not counted" in compute_text(dict(external, projected_hours=None), external["engines"])


def test_gpu_hours_count_a_jobs_whole_time_with_its_server_where_it_is_recorded():
    # The server took 20 minutes to start and 5 to stop around an hour of sending.
    shard = sglang_shard(3600, 10, 8) | {"job": {"wall_s": 3600 + 1500}}
    usage = job_usage({"shards": [shard, sglang_shard(60, 0, 8) | {"job": {"wall_s": 30}}]})
    assert usage["job_hours"] == pytest.approx(5100 / 3600)
    assert usage["gpu_hours"] == pytest.approx(5100 * 8 / 3600)


def test_a_pilots_projection_is_shown_beside_the_hours_used(summary):
    usage = {"math": job_usage(sglang_shard(7200, 9, 2)), "chat": job_usage(sglang_shard(3600, 4, 2))}
    projection = [
        {"category": "math", "mode": "all", "gpu_hours": 40.0, "server_hours": 20.0},
        {"category": "chat", "mode": "thinking", "gpu_hours": 12.5, "server_hours": 6.25},
        {"category": "total", "mode": "all", "gpu_hours": 52.5, "server_hours": 26.25},
    ]
    values = headline_values(read_table(summary), CHECKS, usage, projection)
    assert values["total"]["gpu_hours"] == pytest.approx((7200 + 3600) * 2 / 3600)
    assert values["total"]["projected_hours"] == 52.5 and values["total"]["projected_unit"] == "GPU-hours"
    page = text_of(render(values))
    assert "the pilot projected 52.5 GPU-hours for the full run" in page
    assert "projected GPU-hours" in page
    # Without a pilot there is no projection to show.
    assert "projected" not in text_of(render(headline_values(read_table(summary), CHECKS, usage)))
    # A pilot on a server of unknown GPUs projects server-hours.
    cpu = [dict(row, gpu_hours=None) for row in projection]
    assert "26.2 server-hours" in text_of(render(headline_values(read_table(summary), CHECKS, usage, cpu)))


def test_the_formats_of_numbers():
    assert [count(0), count(1234567)] == ["0", "1,234,567"]
    assert [percent(0.0312), percent(1.0), percent(None)] == ["3.1 %", "100.0 %", "–"]
    assert [hours(0), hours(0.000035), hours(0.034123), hours(3.14159), hours(12.53), hours(1234.4)] == [
        "0",
        "0.0000350",
        "0.0341",
        "3.14",
        "12.5",
        "1,234",
    ]
    mix = verdict_mix({"exact": 3, "whitespace_changed": 0, "reasoning_dropped_by_template": 9})
    assert mix == "reasoning dropped by template 75.0 % (9), exact 25.0 % (3)"


class Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []

    def handle_data(self, data):
        self.parts.append(data)


def text_of(fragment: str) -> str:
    parser = Text()
    parser.feed(fragment)
    return " ".join(" ".join(parser.parts).split())


def test_the_step_writes_the_headline_from_the_runs_files(tmp_path):
    rows = [summary_row("a<b>", "thinking", **CHAT)]
    write_summary(rows, tmp_path / "summary.tsv")
    checks = tmp_path / "checks.json"
    checks.write_text(json.dumps(CHECKS["chat"]))
    generations = tmp_path / "generations.parquet"
    write_table([], pa.schema([("id", pa.string())]), generations, {"shards": [sglang_shard(5400, 7, 8)]})
    out = tmp_path / "results" / "headline.html"
    values = headline(
        categories=["a<b>"],
        summary=tmp_path / "summary.tsv",
        verdict_counts=[checks],
        generations=[generations],
        headline=out,
        projection=[tmp_path / "no-pilot-ran.tsv"],  # as by hand: the default path, absent
    )
    fragment = out.read_text()
    assert fragment.startswith('<section id="run-headline">')
    assert "a&lt;b&gt;" in fragment and "a<b>" not in fragment  # a category's name is text, never markup
    page = text_of(fragment)
    kept, rows_in = CHAT["ok"], sum(CHAT[k] for k in ("ok", "skipped", "filtered"))
    assert f"{count(kept)} of {count(rows_in)} rows kept ({percent(kept / rows_in)})" in page
    assert f"{CHAT['skipped']} skipped, 0 failed, {CHAT['filtered']} filtered" in page
    assert f"{count(CHAT['prompt'])} prompt tokens and {count(CHAT['output'])} output tokens" in page
    assert f"{hours(5400 * 8 / 3600)} GPU-hours" in page and values["total"]["projected_hours"] is None
    assert f"{percent(CHAT['truncated'])} of answers cut at max_new_tokens" in page
    assert "Parser checks (kimi_k2) of 30 answers: exact 90.0 % (27), other 10.0 % (3)" in page
    # One mode in the run: no mode column.
    assert not values["several_modes"] and ">mode<" not in fragment
