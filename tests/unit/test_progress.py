"""Progress of long local steps: a line at the start, lines with counts, percent, rate and ETA at the
interval (or another tenth done), a last line with the total and the time taken; in the rule's log
and on stderr (Snakemake's terminal); tokenize_prompts counts its input ahead for the total."""

import functools
import gzip
import json
import logging
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import conversations, qwen3_model, tokenize_file
from eagle3_datagen.steps import tokenize_prompts as tokenize_module
from eagle3_datagen.storage.progress import Progress, duration, job_wildcards, rate_text
from eagle3_datagen.storage.prompt_files import PromptFileError
from eagle3_datagen.storage.prompts import UNKNOWN_EXTENT, iter_prompts, prompt_extent
from eagle3_datagen.storage.tables import logged
from eagle3_datagen.workflow import setup_logging


class Clock:
    """Seconds that pass only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def progress_lines(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and getattr(r, "progress", False)]


def expected_line(done: int, total: int, elapsed: float) -> str:
    """A progress line as the step should write it, its ETA from the rate so far."""
    rate = done / elapsed
    eta = (total - done) / rate
    return (
        f"{done:,} of {total:,} rows ({math.floor(100 * done / total)}%), {rate_text(rate)} rows/s, "
        f"{duration(elapsed)} elapsed, ETA {duration(eta, tenths=False)}"
    )


def test_durations_read_as_a_clock_does():
    assert [duration(s) for s in (0.42, 42, 200, 7500)] == ["0.4 s", "42 s", "3 min 20 s", "2 h 5 min"]
    assert duration(0.3, tenths=False) == "1 s" and duration(9.6, tenths=False) == "10 s"
    assert [rate_text(r) for r in (12_345.6, 42.4, 2.46)] == ["12,346", "42", "2.5"]


def test_lines_come_at_the_interval_or_another_tenth_with_counts_rate_and_eta(caplog):
    clock, total = Clock(), 12_345
    progress = Progress("check_sequences", total, interval_s=10, clock=clock)
    # (seconds, rows done by then, whether a line is due): nothing within the first 10 s however
    # far it is; then at 10 s since the last line, or when another tenth is done (1 s apart at least).
    steps = [
        (3, 2_000, False),  # 16% within the first interval
        (10.5, 2_500, True),  # the first interval is over
        (12, 2_600, False),  # 21%: no new tenth since 20%
        (13, 3_800, True),  # 30%: another tenth
        (13.5, 5_000, False),  # 40%, but half a second after the last line
        (24, 5_200, True),  # 10 s since the last line
        (30, total, False),  # all done: the last line says it
    ]
    expected = ["0 of 12,345 rows"]
    with caplog.at_level(logging.INFO):
        progress.start()
        done = 0
        for now, upto, due in steps:
            clock.now = now
            progress.advance(upto - done)
            done = upto
            if due:
                expected.append(expected_line(done, total, now))
        clock.now = 31.0
        progress.finish()
    expected.append(f"12,345 of 12,345 rows done in 31 s, {rate_text(total / 31)} rows/s")
    assert progress_lines(caplog, "check_sequences") == expected


def test_a_short_step_says_only_where_it_starts_and_ends(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO):
        batches = []
        for batch in logged(([i] * 100 for i in range(9)), 900, "check_parsers"):
            batches.append(batch)
            clock.now += 1.0
    assert len(batches) == 9
    lines = progress_lines(caplog, "check_parsers")
    assert lines[0] == "0 of 900 rows" and lines[-1].startswith("900 of 900 rows done in ")
    assert len(lines) == 2


def test_logged_counts_pairs_of_batches_and_says_how_far_at_each_interval(caplog):
    pairs = [([1, 2, 3], ["a", "b", "c"]) for _ in range(4)]
    with caplog.at_level(logging.INFO):
        assert list(logged(iter(pairs), 12, "export_dataset", interval_s=0)) == pairs
    lines = progress_lines(caplog, "export_dataset")
    assert lines[0] == "0 of 12 rows" and lines[-1].startswith("12 of 12 rows done in")
    assert [line.split(" rows")[0] for line in lines[1:-1]] == ["3 of 12", "6 of 12", "9 of 12"]


def test_without_a_total_the_share_of_the_input_read_gives_the_eta(caplog):
    clock = Clock()
    progress = Progress("tokenize_prompts", None, interval_s=10, clock=clock)
    with caplog.at_level(logging.INFO):
        progress.start()
        clock.now = 12.0
        progress.advance(300, fraction=0.25)
        clock.now = 14.0
        progress.finish()
    first, middle, last = progress_lines(caplog, "tokenize_prompts")
    assert first.startswith("0 rows")
    eta = 12.0 * 0.75 / 0.25
    assert middle == f"300 rows (25%), {rate_text(300 / 12)} rows/s, 12 s elapsed, ETA {duration(eta, tenths=False)}"
    assert last.startswith("300 rows done in 14 s")


@pytest.fixture
def restored_logging():
    """setup_logging replaces the root logger's handlers: put them back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def test_progress_lines_go_to_the_log_and_to_stderr_other_lines_to_the_log_only(tmp_path, capsys, restored_logging):
    log_file = tmp_path / "logs" / "check_sequences" / "math.log"
    setup_logging(log_file)
    logging.getLogger("eagle3_datagen.steps.check_sequences").info("a line for the log only")
    assert len(list(logged(([0] * 5 for _ in range(3)), 15, "check_sequences"))) == 3
    for handler in logging.getLogger().handlers:
        handler.flush()
    terminal = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in terminal[:1]] == ["check_sequences math: 0 of 15 rows"]
    assert len(terminal) == 2 and terminal[1].split(" ", 1)[1].startswith("check_sequences math: 15 of 15 rows done")
    logged_text = log_file.read_text()
    assert "a line for the log only" in logged_text and "check_sequences: 0 of 15 rows" in logged_text
    assert "check_sequences: 15 of 15 rows done in" in logged_text


def test_a_job_is_named_by_the_wildcards_of_its_log_file():
    assert job_wildcards("logs/check_sequences/math.log") == ("math",)
    assert job_wildcards("/w/logs/generate/math/shard_0.log") == ("math", "shard_0")
    assert job_wildcards("logs/summarize.log") == ()


def write_jsonl(path, rows, *, opener=open, bom=False):
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write(("\ufeff" if bom else "") + "\n")  # a blank line, after a byte order mark
        for i, row in enumerate(rows):
            fh.write(json.dumps(row) + ("\n\n" if i % 3 == 0 else "\n"))


def test_the_rows_of_json_lines_parquet_and_arrow_are_counted_ahead_as_the_pass_reads_them(tmp_path):
    rows = conversations(7)
    write_jsonl(tmp_path / "a.jsonl", rows, bom=True)
    write_jsonl(tmp_path / "b.jsonl.gz", rows[:4], opener=gzip.open)
    table = pa.table({"id": [r["id"] for r in rows], "messages": [json.dumps(r["messages"]) for r in rows]})
    pq.write_table(table, tmp_path / "c.parquet")
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=3):
            writer.write_batch(batch)
    for path in [*sorted(tmp_path.iterdir()), tmp_path]:
        assert prompt_extent(path).rows == len(list(iter_prompts(path))), path


def test_a_json_array_is_counted_by_lines_and_a_record_says_how_far_the_pass_is(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(conversations(6), indent=2))
    second.write_text(json.dumps(conversations(4, prefix="s"), indent=1))
    lines = {path: path.read_text().count("\n") + 1 for path in (first, second)}
    extent = prompt_extent(first)
    assert extent.rows is None and extent.places == {str(first): lines[first]}
    starts = [int(row.source.rsplit(":", 1)[1]) for row in iter_prompts(first)]
    assert [extent.fraction(row.source) for row in iter_prompts(first)] == [n / lines[first] for n in starts]
    # A folder: each file's lines follow the lines of the files read before it.
    extent = prompt_extent(tmp_path)
    last = list(iter_prompts(tmp_path))[-1].source
    into_second = int(last.rsplit(":", 1)[1])
    assert extent.fraction(last) == (lines[first] + into_second) / (lines[first] + lines[second])


def test_an_input_that_cannot_be_read_has_no_extent_and_the_reading_pass_says_why(tmp_path):
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    assert prompt_extent(broken) == UNKNOWN_EXTENT and prompt_extent(tmp_path / "missing.jsonl") == UNKNOWN_EXTENT
    with pytest.raises(PromptFileError, match="broken.jsonl.gz: cannot be read as gzip"):
        list(iter_prompts(broken))


@pytest.mark.parametrize("kind", ["jsonl", "json array"])
def test_tokenize_prompts_says_how_far_it_is_with_the_right_total(
    tmp_path, monkeypatch, caplog, kind, qwen3_tokenizer_dir
):
    rows = conversations(10)
    source = tmp_path / ("c.jsonl" if kind == "jsonl" else "c.json")
    source.write_text("".join(json.dumps(r) + "\n" for r in rows) if kind == "jsonl" else json.dumps(rows, indent=1))
    # A line at every batch of 3 rows: no interval to wait for.
    monkeypatch.setattr(tokenize_module, "Progress", functools.partial(Progress, interval_s=0))
    with caplog.at_level(logging.INFO):
        tokenize_file(source, tmp_path / "p.parquet", qwen3_model(qwen3_tokenizer_dir), batch={"rows": 3})
    lines = progress_lines(caplog, "tokenize_prompts")
    done = [3, 6, 9]
    if kind == "jsonl":
        assert lines[0] == "0 of 10 rows"
        assert [line.split(" (")[0] for line in lines[1:-1]] == [f"{n} of 10 rows" for n in done]
        assert lines[-1].startswith("10 of 10 rows done in")
    else:
        lines_in_file = source.read_text().count("\n") + 1
        starts = [int(row.source.rsplit(":", 1)[1]) for row in iter_prompts(source)]
        done.append(10)  # the total not known ahead, the last batch says how far it is too
        shares = [math.floor(100 * starts[n - 1] / lines_in_file) for n in done]
        assert lines[0].startswith("0 rows")
        assert [line.split(", ")[0] for line in lines[1:-1]] == [f"{n} rows ({s}%)" for n, s in zip(done, shares)]
        assert lines[-1].startswith("10 rows done in")
