"""The prompt files users have: JSONL, JSON arrays (pretty-printed), gzip and zstd, Parquet, Arrow and
`datasets` save_to_disk folders. Rows keep file and line (or row); a file that cannot be read as a
whole fails with one message naming it and where reading stopped, never as one skipped row."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from conftest import qwen3_model, tokenize_file
from eagle3_datagen.steps.tokenize_prompts import BadRows
from eagle3_datagen.storage.prompt_files import PromptFileError
from eagle3_datagen.storage.prompts import read_prompts

SHAREGPT = [
    {
        "id": f"sg-{i}",
        "conversations": [{"from": "human", "value": f"Question {i}?"}, {"from": "gpt", "value": "Answer."}],
    }
    for i in range(4)
]
BROKEN = {"id": "sg-bad", "conversations": [{"from": "wizard", "value": "hi"}]}


def ids(rows):
    return [(r.id, r.ok) for r in rows]


def test_a_pretty_printed_json_array_gives_every_row_with_its_line(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT + [BROKEN], indent=2))
    rows = read_prompts(path)
    assert ids(rows) == [(f"sg-{i}", True) for i in range(4)] + [("sg-bad", False)]
    lines = path.read_text().splitlines()
    for row in rows:  # each row is named by the line its object starts on
        line = int(row.source.rsplit(":", 1)[1])
        assert lines[line - 1].strip() == "{" and f'"{row.id}"' in lines[line]
    assert rows[-1].reason.startswith(f"{path}:{rows[-1].source.rsplit(':', 1)[1]}: field 'conversations[0].from'")


def test_a_json_file_of_lines_reads_as_jsonl(tmp_path):
    path = tmp_path / "lines.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))
    assert [r.source for r in read_prompts(path)] == [f"{path}:{i}" for i in range(1, 5)]


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".json.zst", ".json.gz"])
def test_compressed_files(tmp_path, suffix):
    text = (json.dumps(SHAREGPT) if ".json." in suffix else "".join(json.dumps(r) + "\n" for r in SHAREGPT)).encode()
    data = gzip.compress(text) if suffix.endswith(".gz") else zstandard.ZstdCompressor().compress(text)
    path = tmp_path / f"data{suffix}"
    path.write_bytes(data)
    assert ids(read_prompts(path)) == [(f"sg-{i}", True) for i in range(4)]


def test_parquet_and_a_datasets_folder_name_their_rows(tmp_path):
    table = pa.table(
        {"id": [r["id"] for r in SHAREGPT], "conversations": [json.dumps(r["conversations"]) for r in SHAREGPT]}
    )
    pq.write_table(table, tmp_path / "p.parquet")
    rows = read_prompts(tmp_path / "p.parquet")
    assert ids(rows) == [(f"sg-{i}", True) for i in range(4)] and rows[2].source.endswith("p.parquet:row 3")
    # save_to_disk: Arrow IPC stream files named by state.json, nested columns as they are.
    folder = tmp_path / "saved"
    folder.mkdir()
    nested = pa.Table.from_pylist([{"id": r["id"], "conversations": r["conversations"]} for r in SHAREGPT])
    for k, part in enumerate((nested.slice(0, 2), nested.slice(2))):
        with (
            pa.OSFile(str(folder / f"data-0000{k}-of-00002.arrow"), "wb") as sink,
            pa.ipc.new_stream(sink, part.schema) as writer,
        ):
            writer.write_table(part)
    (folder / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": f"data-0000{k}-of-00002.arrow"} for k in range(2)]})
    )
    (folder / "dataset_info.json").write_text("{}")
    rows = read_prompts(folder)
    assert ids(rows) == [(f"sg-{i}", True) for i in range(4)] and rows[3].source.endswith(
        "data-00001-of-00002.arrow:row 2"
    )


def test_a_folder_of_files_is_read_in_name_order(tmp_path):
    (tmp_path / "b.jsonl").write_text(json.dumps(SHAREGPT[1]) + "\n")
    (tmp_path / "a.json").write_text(json.dumps([SHAREGPT[0]]))
    (tmp_path / "notes.txt").write_text("not prompts")
    assert [r.id for r in read_prompts(tmp_path)] == ["sg-0", "sg-1"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("cut.json", json.dumps(SHAREGPT, indent=1)[:-40].encode(), "the JSON array breaks off at line"),
        ("junk.json", json.dumps(SHAREGPT).encode() + b" trailing", "text after the JSON array at line 1"),
        ("bad.jsonl.gz", b"not gzip at all", "cannot be read as gzip data"),
        ("bad.json.zst", b"not zstd at all", "cannot be read as zstd data"),
        ("text.json", b"hello world", "neither JSON lines nor a JSON array"),
        ("data.csv", b"id,text\n1,hi\n", "unknown prompt file type"),
        ("bad.parquet", b"PAR1 no", "cannot be read as parquet"),
        (
            "latin1.json",
            b'[{"id": "x", "conversations": [{"from": "human", "value": "caf\xe9"}]}]',
            "not valid UTF-8 at line 1",
        ),
    ],
)
def test_a_file_that_cannot_be_read_whole_fails_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PromptFileError, match=message) as err:
        read_prompts(path)
    assert str(path) in str(err.value)


def test_a_truncated_array_says_how_far_reading_got(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(SHAREGPT, indent=1)[:-40])
    with pytest.raises(PromptFileError, match=r"after 3 complete elements; nothing of the file was used"):
        read_prompts(path)


def test_a_category_with_no_usable_row_fails_with_the_counts_per_reason(tmp_path, qwen3_tokenizer_dir):
    path = tmp_path / "all_bad.jsonl"
    path.write_text(json.dumps(BROKEN) + "\n" + json.dumps({"id": "x"}) + "\n" + json.dumps({"id": "y"}) + "\n")

    def run(allow_empty):
        tokenize_file(path, tmp_path / "out.parquet", qwen3_model(qwen3_tokenizer_dir), allow_empty=allow_empty)

    with pytest.raises(BadRows, match="none of its 3 rows can be used") as err:
        run(False)
    assert "2 x field 'messages': missing" in str(err.value) and "1 x field 'conversations[0].from'" in str(err.value)
    run(True)  # allowed: the table holds the three skipped rows
    assert (tmp_path / "out.parquet").exists()


def test_sharegpt_quirks_follow_one_stated_rule_each_and_are_counted(tmp_path):
    row = {
        "id": "quirky",
        "conversations": [
            {"from": "gpt", "value": "Hello! How can I help?"},  # leading assistant turn
            {"from": "human", "value": "First part."},
            {"from": "human", "value": "Second part."},  # same speaker twice
            {"from": "bing", "value": "An answer."},  # a known non-standard speaker
            {"from": "human", "value": "Thanks, and?"},
            {"from": "chatgpt", "value": "The regenerated turn."},
        ],
    }
    path = tmp_path / "q.json"
    path.write_text(json.dumps([row]))
    [r] = read_prompts(path)
    assert [(m["role"], m["content"]) for m in r.messages] == [
        ("user", "First part.\n\nSecond part."),
        ("assistant", "An answer."),
        ("user", "Thanks, and?"),
    ]
    assert r.fixes == {"speakers_mapped": 2, "leading_assistant_dropped": 1, "same_speaker_merged": 1}


def test_per_category_options_field_id_system_prompt_and_sampling(tmp_path):
    from eagle3_datagen.storage.prompt_rows import ReadOptions

    rows = [{"uid": f"u{i}", "chat": [{"role": "user", "content": f"q{i}"}]} for i in range(200)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = ReadOptions(
        messages_field="chat", id_field="uid", system_prompt="Be kind.", max_rows=30, sample_fraction=0.5, seed=3
    )
    read = read_prompts(path, options)
    used = [r for r in read if r.ok]
    assert len(read) == 200 and len(used) == 30  # every row is accounted for
    assert all(r.messages[0] == {"role": "system", "content": "Be kind."} for r in used)
    assert all(r.id.startswith("u") for r in read)
    reasons = {r.reason.split(": ", 1)[1].split(" (")[0] for r in read if not r.ok}
    assert reasons == {"not in the sample", "past max_rows 30"}
    assert [r.id for r in read_prompts(path, options) if r.ok] == [r.id for r in used]  # seeded: the same sample
    other = [r.id for r in read_prompts(path, ReadOptions(**{**options.__dict__, "seed": 4})) if r.ok]
    assert other != [r.id for r in used]


def test_dedup_sends_a_repeated_conversation_once_and_names_what_it_repeats(tmp_path):
    from eagle3_datagen.storage.prompt_rows import ReadOptions

    same = [{"role": "user", "content": "Same question"}]
    rows = [
        {"id": "a", "messages": same},
        {"id": "b", "messages": [{"role": "user", "content": "Other"}]},
        {"id": "c", "messages": same},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert all(r.ok for r in read_prompts(path))  # off by default
    read = read_prompts(path, ReadOptions(dedup=True))
    assert [r.ok for r in read] == [True, True, False] and read[2].reason.endswith(
        "the same conversation as 'a' (dedup)"
    )


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
def test_a_json_array_streams_through_small_blocks_with_the_same_rows_and_lines(tmp_path, monkeypatch, block):
    """Blocks smaller than one element, numbers cut at a block's end, multi-byte characters split
    across blocks and the buffer's compaction give the rows and lines of a whole-file read."""
    from eagle3_datagen.storage import prompt_files

    conversations = [
        {"id": 10**i, "conversations": [{"from": "human", "value": f"Frage {i}: café ✓ {'x' * (i * 13)}"}]}
        for i in range(12)
    ]
    path = tmp_path / "stream.json"
    path.write_text(json.dumps(conversations, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    expected = read_prompts(path)
    monkeypatch.setattr(prompt_files, "BLOCK", block)
    rows = read_prompts(path)
    assert [(r.id, r.source, r.messages) for r in rows] == [(e.id, e.source, e.messages) for e in expected]
    assert [r.id for r in rows] == [str(10**i) for i in range(12)]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert all(lines[int(r.source.rsplit(":", 1)[1]) - 1].strip() == "{" for r in rows)
    cut = tmp_path / "cut.json"
    cut.write_text(path.read_text(encoding="utf-8")[:-60], encoding="utf-8")
    with pytest.raises(PromptFileError, match=r"breaks off at line \d+ column \d+ .* after 11 complete elements"):
        read_prompts(cut)


def test_jsonl_lines_longer_than_a_block_and_a_last_line_without_newline(tmp_path, monkeypatch):
    from eagle3_datagen.storage import prompt_files

    monkeypatch.setattr(prompt_files, "BLOCK", 5)
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in SHAREGPT) + "\n\n" + json.dumps(BROKEN))
    rows = read_prompts(path)
    assert ids(rows) == [(f"sg-{i}", True) for i in range(4)] + [("sg-bad", False)]
    assert [r.source.rsplit(":", 1)[1] for r in rows] == ["1", "2", "3", "4", "6"]
