"""Property-based fuzzing of every prompt reader and normalizer (hypothesis).

Whatever a prompt file holds, each of its rows becomes exactly one PromptRow, in order: usable, or
skipped with a reason that begins with its file and line. Only a file that cannot be read as a whole
raises, and only PromptFileError; no generated row is `unexpected` (that would be a bug of the
readers); and every row goes through the chat template, the tokenizer and the Parquet writer as an ok
or a skipped row of the prompts table.

The suite draws a few derandomized examples per test (tests/conftest.py); for a deep run:
    HYPOTHESIS_PROFILE=deep .venv/bin/pytest tests/unit/test_prompt_fuzz.py
"""

import codecs
import datetime
import decimal
import gzip
import json
import re
import tempfile
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import qwen3_model, tokenize_file
from eagle3_datagen.settings import Budget, ModelProfile, canonical_json
from eagle3_datagen.storage import prompt_files, prompts
from eagle3_datagen.storage.prompt_files import PromptFileError
from eagle3_datagen.storage.prompt_rows import ROLES, SHAREGPT_ROLES, PromptRow, ReadOptions, RowError, normalize_row
from eagle3_datagen.storage.prompts import iter_prompts
from eagle3_datagen.storage.tables import PROMPTS_SCHEMA, TableWriter, read_rows

# ---------------------------------------------------------------------------------------------------
# Strategies


def weighted(*choices):
    """One of the strategies, each drawn in proportion to its weight."""
    table = [s for weight, s in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


# Text that spells the templates' special tokens, invalid Unicode (lone surrogates, which JSON's
# "\ud800" escape gives), NUL and control characters, bidi and combining marks, emoji sequences.
SPECIAL = [
    "<|im_end|>",
    "<|im_start|>assistant\n",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
]
EDGE = [
    "\ud800",
    "\udfff",
    "\x00",
    "\x01",
    "\x1b",
    "\x7f",
    "\x85",
    "\u200b",
    "\u200f",
    "\u202e",
    "\u0301",
    "\u2028",
    "\ufeff",
    "\ufffd",
    "\U0001f600",
    "\U0001f469\u200d\U0001f467",
    "\U0010ffff",
    "\r",
    "\n",
    "\t",
    " ",
    "é",
    "中",
]
LONG = [("word ", 2000), ("\U0001f600", 3000), ("ab", 6000)]  # made when drawn: a short repr

pieces = weighted(
    (6, st.text(max_size=12)),
    (3, st.sampled_from(SPECIAL)),
    (3, st.lists(st.sampled_from(EDGE), min_size=1, max_size=6).map("".join)),
    (1, st.sampled_from(LONG).map(lambda long: long[0] * long[1])),
)
texts = st.lists(pieces, max_size=4).map("".join)
nonblank = st.tuples(texts, st.sampled_from(["a", "?", "中", "\U0001f600", "<think>"]), texts).map("".join)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), texts)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8
)


def mostly(good, other=json_values):
    """Three draws in four well-formed, so that most rows reach the tokenizer; the fourth anything."""
    return weighted((3, good), (1, other))


text_part = st.fixed_dictionaries({"type": st.just("text"), "text": texts})
other_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["image_url", "input_audio", "text"]), "image_url": json_values}
)
contents = mostly(texts | st.lists(text_part, min_size=1, max_size=3), st.lists(mostly(text_part, other_part)))
tool_calls = st.lists(
    mostly(
        st.fixed_dictionaries(
            {
                "id": texts,
                "type": st.just("function"),
                "function": st.fixed_dictionaries({"name": texts, "arguments": texts | json_values}),
            }
        )
    ),
    max_size=2,
)
tools = mostly(
    st.lists(
        mostly(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": nonblank, "description": texts, "parameters": json_values}
                    ),
                }
            )
        ),
        max_size=2,
    )
)
message_extras = {
    "tool_calls": mostly(tool_calls),
    "tool_call_id": mostly(texts),
    "name": mostly(texts),
    "reasoning_content": mostly(texts),
    "weight": json_values,
}
openai_messages = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(ROLES)), "content": contents}, optional=message_extras
)
sharegpt_messages = st.fixed_dictionaries(
    {"from": mostly(st.sampled_from(sorted(SHAREGPT_ROLES))), "value": contents}, optional=message_extras
)
ids = weighted((4, texts), (2, st.integers(-(2**63), 2**63 - 1)), (1, json_values))
row_extras = {"id": ids, "tools": tools, "meta": json_values}
openai_rows = st.fixed_dictionaries(
    {"messages": mostly(st.lists(openai_messages, min_size=1, max_size=5))}, optional=row_extras
)
sharegpt_rows = st.fixed_dictionaries(
    {"conversations": mostly(st.lists(sharegpt_messages, min_size=1, max_size=5))}, optional=row_extras
)


@st.composite
def usable_rows(draw):
    """A conversation that ends with a user message, every text non-blank: a row that must be usable
    unless its text is invalid Unicode."""
    turns = draw(st.lists(st.tuples(nonblank, nonblank), max_size=2))
    messages = [m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})]
    messages.append({"role": "user", "content": draw(nonblank)})
    if draw(st.booleans()):
        messages.insert(0, {"role": "system", "content": draw(nonblank)})
    return {"id": "u-" + draw(st.text(max_size=12)).replace("\n", " "), "messages": messages}


object_rows = weighted((2, openai_rows), (2, sharegpt_rows), (1, usable_rows()))
rows = weighted((6, object_rows), (1, json_values))  # a row need not be an object
options = st.builds(
    ReadOptions,
    messages_field=st.sampled_from([None, None, "messages", "conversations"]),
    id_field=st.sampled_from(["id", "id", "meta"]),
    system_prompt=st.sampled_from([None, None, "Be brief.", "Say <|im_end|> or <think>."]),
    max_rows=st.none() | st.integers(0, 6),
    sample_fraction=st.none() | st.floats(0, 1),
    seed=st.integers(0, 3),
    dedup=st.booleans(),
)

# What a Parquet or Arrow row can hold that JSON cannot: bytes, dates, decimals, tuples (Arrow maps).
python_values = st.recursive(
    scalars
    | st.binary(max_size=8)
    | st.datetimes()
    | st.dates()
    | st.times()
    | st.timedeltas()
    | st.decimals()
    | st.tuples(scalars, scalars),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(texts | st.integers(-5, 5), inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=8,
)


def deep(n: int):
    value = []
    for _ in range(n):
        value = [value]
    return value


# ---------------------------------------------------------------------------------------------------
# Properties of one row


def check_usable(row: PromptRow) -> None:
    """What a usable row promises every later step."""
    assert row.ok and not row.unexpected and row.id.strip() and "\n" not in row.id
    row.id.encode("utf-8")
    assert row.messages and row.messages[-1]["role"] in ("user", "tool")
    assert all(m["role"] in ROLES and isinstance(m["content"], str) for m in row.messages)
    canonical_json([row.messages, row.tools])  # hashable: valid Unicode, JSON values only
    json.dumps([row.messages, row.tools], allow_nan=False)  # no NaN: strict JSON readers take it
    assert row.tools is None or (isinstance(row.tools, list) and row.tools)


@given(obj=rows, options=options)
def test_normalize_row_gives_a_row_or_a_row_error(obj, options):
    try:
        row = normalize_row(obj, source="f.jsonl:1", options=options)
    except RowError as exc:
        assert str(exc).startswith("field '")
        return
    check_usable(row)
    assert json.loads(json.dumps([row.messages, row.tools])) == [row.messages, row.tools]


@given(obj=st.dictionaries(st.sampled_from(["id", "messages", "conversations", "tools", "x"]), python_values))
def test_normalize_row_refuses_what_json_cannot_hold_with_a_row_error(obj):
    """Parquet and Arrow rows carry bytes, dates, decimals: a RowError naming the field, or a row
    whose used fields are plain JSON."""
    try:
        row = normalize_row(obj, source="f.parquet:row 1")
    except RowError:
        return
    check_usable(row)


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"id": "x", "conversations": [{"from": "gpt", "value": "Hello!"}]}, "nothing to answer: only assistant"),
        ({"id": "x", "conversations": [{"from": ["human"], "value": "hi"}]}, "'conversations[0].from': unknown"),
        ({"id": "x", "messages": [{"role": {"a": 1}, "content": "hi"}]}, "'messages[0].role': unknown role"),
        ({"id": "x", "messages": [{"role": "user", "content": "caf\ud800"}]}, "'messages[0].content': invalid"),
        ({"id": "x\udc80", "messages": [{"role": "user", "content": "hi"}]}, "'id': invalid Unicode"),
        (
            {"id": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "'messages[0].content[0].text': invalid Unicode",
        ),
        (
            {"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{"f": {"d": b"\x00"}}]},
            "'tools[0].f.d': a bytes value",
        ),
        (
            {"id": "x", "messages": [{"role": "user", "content": "hi", "name": datetime.date(2024, 1, 2)}]},
            "'messages[0].name': a date value",
        ),
        (
            {"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{"p": decimal.Decimal("1.5")}]},
            "'tools[0].p': a Decimal value",
        ),
        ({"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": float("nan")}]}, "not a JSON"),
        ({"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{"\ud800": 1}]}, "(a key)': invalid"),
        ({"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{1: 2, "a": 3}]}, "key of type int"),
        (
            {"id": "x", "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": deep(5000)}]},
            "nested too deeply",
        ),
    ],
)
def test_the_foreseen_problems_are_row_errors_naming_the_field(obj, message):
    with pytest.raises(RowError, match=re.escape(message)):
        normalize_row(obj, source="f.jsonl:1")


def test_a_row_without_id_keeps_a_content_id_when_an_unused_column_is_not_json():
    obj = {"created": datetime.datetime(2024, 1, 2), "blob": b"\x00", "messages": [{"role": "user", "content": "hi"}]}
    row = normalize_row(obj, source="f.parquet:row 1")
    assert row.ok and row.id.startswith("sha256-") and row.id == normalize_row(dict(obj), source="x").id


# ---------------------------------------------------------------------------------------------------
# Files


def compressed(data: bytes, kind: str, split: float) -> bytes:
    """`data` gzipped or zstd-compressed; zstd in two frames (as pzstd or cat writes) where split < 1."""
    if kind == ".gz":
        return gzip.compress(data)
    if kind == ".zst":
        cut = int(len(data) * split)
        return b"".join(zstandard.ZstdCompressor().compress(part) for part in (data[:cut], data[cut:]) if part)
    return data


def dumped(value, ascii_only: bool, indent=None) -> bytes:
    """JSON text of a value; without ensure_ascii a lone surrogate is written as it is (invalid UTF-8)."""
    return json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode("utf-8", "surrogatepass")


def read_all(path: Path, options: ReadOptions | None = None, block: int = prompt_files.BLOCK) -> list[PromptRow]:
    with mock.patch.object(prompt_files, "BLOCK", block):
        got = list(iter_prompts(path, options))
    for row in got:
        assert isinstance(row, PromptRow) and not row.unexpected, row.reason
        assert row.id and isinstance(row.id, str)
        row.id.encode("utf-8")
        if row.ok:
            check_usable(row)
        else:
            assert row.reason.startswith(f"{row.source}: ")
            row.reason.encode("utf-8")
    return got


DEEP_LINE = b'{"id": "deep", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}"
HUGE_INT_LINE = b'{"id": 1' + b"0" * 5000 + b', "messages": []}'
garbage_lines = st.one_of(
    st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from(
        [b"null", b"[1, 2]", b'"text"', b"{", b'{"id": 1,}', b"\xef\xbb\xbf{}", b"\xff\xfe", DEEP_LINE, HUGE_INT_LINE]
    ),
)
compressions = st.sampled_from(["", ".gz", ".zst"])
# Block sizes of the streaming readers (prompt_files.BLOCK, 1 MiB): small ones cut lines, numbers and
# multi-byte characters at blocks' ends. A compressed file is read in 64 bytes or more: gzip's cost
# per read would make 1-byte reads of a 60 kB file take seconds.
blocks = st.sampled_from([1, 7, 64, 1 << 20])


def block_for(block: int, compression: str) -> int:
    return max(block, 64) if compression else block


@given(
    first=object_rows,
    lines=st.lists(
        weighted((3, rows.map(lambda r: ("row", r))), (1, garbage_lines.map(lambda b: ("raw", b)))), max_size=6
    ),
    blank=st.lists(st.sampled_from([b"", b"  ", b"\r", b"\t"]), max_size=2),
    ascii_only=st.booleans(),
    crlf=st.booleans(),
    bom=st.booleans(),
    final_newline=st.booleans(),
    suffix=st.sampled_from([".jsonl", ".ndjson", ".json"]),
    compression=compressions,
    split=st.floats(0, 1),
    block=blocks,
    options=options,
)
def test_jsonl_every_line_is_one_row_in_order(
    first, lines, blank, ascii_only, crlf, bom, final_newline, suffix, compression, split, block, options
):
    encoded = [dumped(first, ascii_only)]
    for kind, value in lines:
        encoded.append(dumped(value, ascii_only) if kind == "row" else value)
    encoded[1:1] = blank  # blank lines are no rows, but count as lines
    end = b"\r\n" if crlf else b"\n"
    data = (codecs.BOM_UTF8 if bom else b"") + end.join(encoded) + (end if final_newline else b"")
    expected = [n for n, line in enumerate(encoded, start=1) if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"prompts{suffix}{compression}"
        path.write_bytes(compressed(data, compression, split))
        got = read_all(path, options, block_for(block, compression))
    assert [r.source for r in got] == [f"{path}:{n}" for n in expected]


@given(
    elements=st.lists(rows, max_size=6),
    broken=st.none() | st.tuples(st.integers(0, 6), st.sampled_from([b"[" * 3000 + b"]" * 3000, b"1" * 5000])),
    indent=st.sampled_from([None, 1, 2, "\t"]),
    ascii_only=st.booleans(),
    bom=st.booleans(),
    compression=compressions,
    split=st.floats(0, 1),
    block=blocks,
    options=options,
)
def test_a_json_array_gives_one_row_per_element_or_fails_whole(
    elements, broken, indent, ascii_only, bom, compression, split, block, options
):
    parts = [dumped(e, ascii_only, indent) for e in elements]
    if broken is not None:
        parts.insert(min(broken[0], len(parts)), broken[1])
    separator = b",\n" if indent is not None else b","
    data = (codecs.BOM_UTF8 if bom else b"") + b"[" + separator.join(parts) + b"]\n"
    invalid_utf8 = any(not valid_utf8(p) for p in parts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"sharegpt.json{compression}"
        path.write_bytes(compressed(data, compression, split))
        if not parts or invalid_utf8 or broken is not None:
            # An array cannot be read past a broken element: the whole file fails, naming where.
            with pytest.raises(PromptFileError, match="is empty|not valid UTF-8|cannot be read") as err:
                read_all(path, options, block_for(block, compression))
            assert str(path) in str(err.value)
            return
        got = read_all(path, options, block_for(block, compression))
    assert len(got) == len(elements)
    lines = [int(r.source.rsplit(":", 1)[1]) for r in got]
    assert lines == sorted(lines) and all(r.source.startswith(f"{path}:") for r in got)
    if indent is None:
        assert set(lines) == {1}


def valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def arrow_id(value):
    """An id as an Arrow string column holds it: a string as it is, anything else as its JSON."""
    if isinstance(value, str) and valid_utf8(value.encode("utf-8", "surrogatepass")):
        return value
    return json.dumps(value)


def arrow_table(records: list, nested: bool, extras: list[str]) -> pa.Table:
    """Rows as an Arrow table: nested columns where Arrow can infer one type for them, else the
    conversation columns as JSON text (as Parquet exports of chat data usually hold them); plus
    columns of what JSON cannot hold, one with a timestamp Python cannot represent."""
    table = None
    if nested:
        try:
            table = pa.Table.from_pylist(records)
        except (pa.ArrowException, OverflowError, UnicodeEncodeError, TypeError, ValueError):
            table = None
    if table is None:
        columns = {"id": [arrow_id(r["id"]) if "id" in r else None for r in records]}
        for key in ("messages", "conversations", "tools", "meta"):
            if any(key in r for r in records):
                columns[key] = [json.dumps(r[key]) if key in r else None for r in records]
        table = pa.table(columns)
    n = table.num_rows
    if "blob" in extras:
        table = table.append_column("blob", pa.array([b"\x00\xff"] * n, pa.binary()))
    if "price" in extras:
        table = table.append_column("price", pa.array([decimal.Decimal("1.25")] * n, pa.decimal128(5, 2)))
    if "created" in extras:  # year 3e6: beyond Python's datetime, so the row cannot be read
        values = [10**17 if i % 2 else 1_700_000_000_000 for i in range(n)]
        table = table.append_column("created", pa.array(values, pa.timestamp("ms")))
    if "bad_utf8" in extras:  # a writer that did not validate its strings
        offsets = pa.py_buffer(b"".join((2 * i).to_bytes(4, "little") for i in range(n + 1)))
        table = table.append_column(
            "bad_utf8", pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(b"\xff\xfe" * n)])
        )
    return table


def write_columnar(table: pa.Table, path: Path, kind: str) -> None:
    if kind == "parquet":
        pq.write_table(table, path, row_group_size=3)
        return
    with pa.OSFile(str(path), "wb") as sink:
        writer = pa.ipc.new_stream(sink, table.schema) if kind == "stream" else pa.ipc.new_file(sink, table.schema)
        with writer:
            writer.write_table(table, max_chunksize=3)


columnar_rows = st.lists(object_rows, min_size=1, max_size=6)
extras = st.lists(st.sampled_from(["blob", "price", "created", "bad_utf8"]), unique=True)


@given(
    records=columnar_rows,
    nested=st.booleans(),
    extras=extras,
    kind=st.sampled_from(["parquet", "stream", "file"]),
    messages_field=st.sampled_from([None, "messages", "conversations"]),
)
def test_parquet_and_arrow_every_row_is_one_row_in_order(records, nested, extras, kind, messages_field):
    table = arrow_table(records, nested, extras)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("data.parquet" if kind == "parquet" else "data.arrow")
        try:
            write_columnar(table, path, kind)
        except pa.ArrowNotImplementedError:  # Parquet holds no struct without fields; Arrow does
            write_columnar(arrow_table(records, False, extras), path, kind)
        got = read_all(path, ReadOptions(messages_field=messages_field))
    assert [r.source for r in got] == [f"{path}:row {i}" for i in range(1, len(records) + 1)]
    for i, row in enumerate(got):
        cells = [c for c in extras if c == "bad_utf8" or (c == "created" and i % 2)]
        if cells:  # a value Arrow cannot give Python is its row's error, naming the column
            assert not row.ok and any(f"field '{c}': its " in row.reason for c in cells), row.reason


@given(
    records=columnar_rows,
    files=st.integers(1, 3),
    order=st.permutations(range(3)),
)
def test_a_datasets_folder_is_read_in_the_order_its_state_names(records, files, order):
    table = arrow_table(records, nested=True, extras=[])
    names = [f"data-{k:05d}-of-{files:05d}.arrow" for k in range(files)]
    listed = [names[k] for k in order if k < files]  # not name order: state.json's order counts
    bounds = [len(records) * k // files for k in range(files + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "saved"
        folder.mkdir()
        for name, start, stop in zip(listed, bounds, bounds[1:]):
            write_columnar(table.slice(start, stop - start), folder / name, "stream")
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in listed]}))
        (folder / "dataset_info.json").write_text("{}")
        got = read_all(folder)
    expected = [
        f"{folder / name}:row {i}"
        for name, start, stop in zip(listed, bounds, bounds[1:])
        for i in range(1, stop - start + 1)
    ]
    assert [r.source for r in got] == expected


@given(
    contents=st.lists(
        st.tuples(st.sampled_from(["jsonl", "json", "parquet", "jsonl.gz", "json.zst"]), columnar_rows),
        min_size=1,
        max_size=3,
    ),
)
def test_a_folder_of_files_is_read_in_name_order(contents):
    expected = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "notes.txt").write_text("not prompts")
        for k, (kind, records) in enumerate(contents):
            path = folder / f"part-{k}.{kind}"
            if kind.startswith("parquet"):
                write_columnar(arrow_table(records, nested=False, extras=[]), path, "parquet")
                expected += [f"{path}:row {i}" for i in range(1, len(records) + 1)]
            elif kind.startswith("jsonl"):
                data = b"".join(dumped(r, True) + b"\n" for r in records)
                path.write_bytes(compressed(data, Path(kind).suffix if "." in kind else "", 0.5))
                expected += [f"{path}:{i}" for i in range(1, len(records) + 1)]
            else:
                data = b"[" + b",".join(dumped(r, ascii_only=True) for r in records) + b"]"
                path.write_bytes(compressed(data, Path(kind).suffix if "." in kind else "", 0.5))
                expected += [f"{path}:1"] * len(records)
        got = read_all(folder)
    assert [r.source for r in got] == expected


@pytest.mark.parametrize(
    "state, message",
    [
        ("not json", "cannot be read as JSON"),
        ("[]", "not a `datasets` state.json"),
        ("{}", "not a `datasets` state.json"),
        ('{"_data_files": "data.arrow"}', "not a `datasets` state.json"),
        ('{"_data_files": [{"name": "data.arrow"}]}', "not a `datasets` state.json"),
        ('{"_data_files": [{"filename": 3}]}', "a `_data_files` filename is 3"),
        ('{"_data_files": [{"filename": "missing.arrow"}]}', "names 'missing.arrow'"),
        ('{"_data_files": []}', "names no files"),
    ],
)
def test_a_datasets_state_json_that_cannot_say_which_files_fails_the_folder(tmp_path, state, message):
    write_columnar(
        pa.table({"id": ["a"], "messages": ['[{"role": "user", "content": "hi"}]']}), tmp_path / "data.arrow", "stream"
    )
    (tmp_path / "state.json").write_text(state)
    with pytest.raises(PromptFileError, match=message):
        list(iter_prompts(tmp_path))


def test_a_truncated_zstd_file_fails_whole_instead_of_ending_early(tmp_path):
    data = b"".join(
        json.dumps({"id": i, "messages": [{"role": "user", "content": f"q {i}"}]}).encode() + b"\n"
        for i in range(20000)
    )
    path = tmp_path / "p.jsonl.zst"
    whole = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        PromptFileError, match="cannot be read as zstd data: EOFError: the file ends inside a zstd frame"
    ):
        list(iter_prompts(path))
    path.write_bytes(whole + zstandard.ZstdCompressor().compress(data[:10]))  # a second frame is read on
    assert len(list(iter_prompts(path))) == 20001


def test_lines_json_cannot_read_are_skipped_rows_and_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "p.jsonl"
    good = b'{"id": "ok", "messages": [{"role": "user", "content": "hi"}]}'
    path.write_bytes(b"\xef\xbb\xbf" + good + b"\n" + DEEP_LINE + b"\n" + HUGE_INT_LINE + b"\n")
    got = read_all(path)
    assert [r.ok for r in got] == [True, False, False]
    assert got[1].reason == f"{path}:2: JSON nested too deeply to read (past Python's recursion limit)"
    assert got[2].reason.startswith(f"{path}:3: JSON that cannot be read: Exceeds the limit (4300 digits)")


@pytest.mark.parametrize(
    "broken, problem", [(b"[" * 3000 + b"]" * 3000, "nested too deeply to read"), (b"1" * 5000, "Exceeds")]
)
def test_an_array_element_json_cannot_read_fails_the_file_naming_it(tmp_path, broken, problem):
    path = tmp_path / "a.json"
    path.write_bytes(
        b'\xef\xbb\xbf[\n{"id": "ok", "messages": [{"role": "user", "content": "hi"}]},\n  ' + broken + b"\n]"
    )
    with pytest.raises(
        PromptFileError, match=f"element 2 of the JSON array, at line 3 column 3, cannot be read \\({problem}"
    ):
        read_all(path)


@pytest.mark.parametrize("block", [1, 2, 3, 5])
def test_numbers_cut_at_a_blocks_end_are_read_whole(tmp_path, block):
    """Found by the deep fuzz run: `[0.0]` in 1-byte blocks failed the file, "0" read as a whole
    number and ".0" left over (only a number reaching the block's very end was read again)."""
    path = tmp_path / "a.json"
    path.write_text("[0.0, 1e5, -2.5E-3, 12345]")
    got = read_all(path, block=block)
    assert [r.reason.split(": ", 1)[1] for r in got] == ["field '<row>': expected a JSON object, got float"] * 3 + [
        "field '<row>': expected a JSON object, got int"
    ]


@pytest.mark.parametrize(
    "conversation, reason",
    [
        ([{"from": "gpt", "value": "Hi! How can I help?"}], "nothing to answer: only assistant turns"),
        ([{"from": "system", "value": "Be kind."}], "nothing to answer: the conversation must end with a user"),
        ([{"from": "system", "value": "Be kind."}, {"from": "gpt", "value": "Hi!"}], "nothing to answer: the"),
        ([], "empty conversation"),
    ],
)
def test_real_sharegpt_conversations_with_nothing_to_answer_are_skipped_rows(tmp_path, conversation, reason):
    """About 1.4% of real ShareGPT: one assistant turn, one system turn, or nothing."""
    path = tmp_path / "sharegpt.json"
    rows = [
        {"id": "a", "conversations": conversation},
        {"id": "b", "conversations": [{"from": "human", "value": "Hi"}]},
    ]
    path.write_text(json.dumps(rows))
    got = read_all(path)
    assert [r.ok for r in got] == [False, True]
    assert got[0].reason.startswith(f"{path}:1: field 'conversations': {reason}")


def test_an_exception_nobody_foresaw_skips_its_row_marked_and_logged(tmp_path, monkeypatch, caplog):
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n" for i in range(3)
        )
    )
    real = normalize_row

    def flaky(obj, **kwargs):
        if obj["id"] == "r1":
            raise KeyError("a bug")
        return real(obj, **kwargs)

    monkeypatch.setattr(prompts, "normalize_row", flaky)
    got = list(iter_prompts(path))
    assert [(r.id, r.ok, r.unexpected) for r in got] == [("r0", True, False), ("r1", False, True), ("r2", True, False)]
    assert (
        got[1].reason == f"{path}:2: unexpected error (a possible bug; the traceback is in the log): KeyError: 'a bug'"
    )
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.exc_info and f"{path}:2" in record.getMessage()


# ---------------------------------------------------------------------------------------------------
# Through the tokenizer and the Parquet writer


@pytest.fixture(scope="module", params=["qwen3", "kimi"])
def chat(request, qwen3_tokenizer_dir):
    from eagle3_datagen.tokens.templating import ChatTokenizer
    from eagle3_datagen.tokens.vocabulary import load_tokenizer

    if request.param == "qwen3":
        profile = ModelProfile.from_config(qwen3_model(qwen3_tokenizer_dir))
    else:
        profile = ModelProfile(
            name="kimi",
            tokenizer=str(request.getfixturevalue("kimi_tokenizer_dir")),
            context_length=4096,
            stop_tokens=("<|im_end|>",),
            chat_template_kwargs={"thinking": True},
            prompt_suffix=("<think>",),
        )
    return ChatTokenizer(load_tokenizer(profile), profile)


# JSON lines: the first an object (a first line of anything else makes it no JSONL file).
jsonl_rows = st.tuples(object_rows, st.lists(rows, max_size=5)).map(lambda rows: [rows[0], *rows[1]])


@given(records=jsonl_rows, ascii_only=st.booleans(), turns=st.sampled_from(["all", "last"]))
def test_every_row_becomes_an_ok_or_skipped_row_of_the_prompts_table(chat, records, ascii_only, turns):
    from eagle3_datagen.steps.tokenize_prompts import build_prompt_rows

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.jsonl"
        path.write_bytes(b"".join(dumped(r, ascii_only) + b"\n" for r in records))
        got = read_all(path)
        table = build_prompt_rows(
            got,
            chat,
            profile=chat.profile,
            budget=Budget(max_new_tokens=32, min_new_tokens=1, reserve_tokens=2),
            category="fuzz",
            turns=turns,
        )
        with TableWriter(Path(tmp) / "prompts.parquet", PROMPTS_SCHEMA) as writer:
            writer.write(table)
            writer.close({})
        written = read_rows(Path(tmp) / "prompts.parquet")
    assert [(r["id"], r["source"]) for r in written] == [(r.id, r.source) for r in got]
    for row in written:
        assert row["status"] in ("ok", "skipped")
        assert (row["status"] == "ok") == (row["reason"] == "")
        assert row["status"] == "skipped" or (row["prompt_ids"] and row["max_new_tokens"] >= 1)


# The step loads its tokenizer each time: a few examples, a few dozen in a deep run.
@settings(max_examples=min(50, max(3, settings().max_examples // 8)))
@given(records=st.lists(object_rows, min_size=1, max_size=8))
def test_the_tokenize_step_finishes_on_fuzzed_rows(qwen3_tokenizer_dir, records):
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "fuzz.jsonl"
        source.write_bytes(b"".join(dumped(r, True) + b"\n" for r in records))
        out = tokenize_file(
            source,
            Path(tmp) / "prompts.parquet",
            qwen3_model(qwen3_tokenizer_dir),
            category="fuzz",
            budget={"max_new_tokens": 32, "min_new_tokens": 1, "reserve_tokens": 2},
            allow_empty=True,
            max_unexpected_row_share=0.0,
        )
        assert len(read_rows(out)) == len(records)
