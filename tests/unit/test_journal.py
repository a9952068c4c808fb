"""The generate journal: resumable, keyed by (id, sample_index), torn tails recovered, and a full
disk met without a torn line or a lost entry."""

import errno
import json
import os

import pytest

from eagle3_datagen.generation import journal as journal_module
from eagle3_datagen.generation.journal import Journal
from eagle3_datagen.storage.disk import DiskFull


def entry(i, status="ok", fingerprint=None):
    fingerprint = fingerprint or f"f{i}"
    return {"id": f"r{i}", "sample_index": 0, "fingerprint": fingerprint, "status": status, "output_ids": [i, 7]}


def test_entries_survive_a_reopen(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        for i in range(5):
            j.append(entry(i))
    with Journal(path) as j:
        assert set(j._keys) == {(f"r{i}", 0, 0, "default") for i in range(5)}
        assert j.reusable("f3")["output_ids"] == [3, 7]


def test_torn_last_line_is_cut_and_the_rest_kept(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        for i in range(3):
            j.append(entry(i))
    with open(path, "ab") as fh:
        fh.write(b'{"id": "r3", "sample_index": 0, "status": "o')
    with Journal(path) as j:
        assert j.torn_bytes > 0
        assert set(j._keys) == {("r0", 0, 0, "default"), ("r1", 0, 0, "default"), ("r2", 0, 0, "default")}
        j.append(entry(3))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["r0", "r1", "r2", "r3"]


def test_only_ok_entries_with_the_same_fingerprint_are_reused(tmp_path):
    with Journal(tmp_path / "j.jsonl") as j:
        j.append(entry(1, status="failed"))
        j.append(entry(2, fingerprint="old"))
        j.append(entry(3))
        assert j.reusable("f1") is None
        assert j.reusable("f2") is None
        assert j.reusable("old") is not None
        assert j.reusable("f3") is not None


def test_last_entry_for_a_key_wins(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append(entry(1, status="failed"))
        j.append(entry(1))
    with Journal(path) as j:
        assert j.entry(("r1", 0))["status"] == "ok"


def test_fsync_comes_in_batches(tmp_path):
    with Journal(tmp_path / "j.jsonl", sync_every=3, sync_interval_s=3600) as j:
        j.append(entry(1))
        j.append(entry(2))
        assert not j.sync_due()
        j.append(entry(3))
        assert j.sync_due()
        j.sync()
        assert not j.sync_due()


def test_each_turn_of_a_conversation_is_its_own_entry(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append({"id": "c", "sample_index": 0, "status": "ok", "fingerprint": "f0", "output_ids": [1]})
        j.append({"id": "c", "sample_index": 0, "turn": 1, "status": "ok", "fingerprint": "f1", "output_ids": [2]})
    with Journal(path) as j:
        assert set(j._keys) == {("c", 0, 0, "default"), ("c", 0, 1, "default")}
        assert j.entry(("c", 0))["output_ids"] == [1]  # a key without a turn is turn 0
        assert j.entry(("c", 0, 1))["output_ids"] == [2] and j.reusable("f1")["turn"] == 1


def writes_to(path):
    """Whether a descriptor is open on `path`."""
    return lambda fd: os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(path)


def failing_writes(monkeypatch, path, code):
    """Make writes to `path` fail with `code` after taking half of the first line they are given
    (a disk that fills mid-line); other writes go through. Returns the lengths of the lines tried."""
    real_write, to_journal, tried = os.write, writes_to(path), []

    def write(fd, data):
        if not to_journal(fd):
            return real_write(fd, data)
        tried.append(len(data))
        if len(tried) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(journal_module.os, "write", write)
    return tried


def whole_lines(path):
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "the journal ends in part of a line"
    return [json.loads(line) for line in data.splitlines()]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_mid_line_leaves_whole_lines_and_stops_the_journal(tmp_path, monkeypatch, code):
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.remaining_rows = 10
    for i in range(3):
        j.append(entry(i))
    before = path.read_bytes()
    tried = failing_writes(monkeypatch, path, code)
    with pytest.raises(DiskFull) as failure:
        j.append({**entry(3), "output_ids": list(range(500))})
    message = str(failure.value)
    assert failure.value.errno == code and failure.value.path == path
    assert str(path) in message and f"{tried[0]} bytes" in message  # the line that did not fit
    # The rest (this row and the 6 after it) at the mean size of the entries written so far.
    assert f"about {round(7 * len(before) / 3)} bytes" in message
    assert ("quota" in message) == (code == errno.EDQUOT)
    assert "free on" in message and "rerun" in message
    assert path.read_bytes() == before and [e["id"] for e in whole_lines(path)] == ["r0", "r1", "r2"]
    monkeypatch.undo()  # the disk has room again: the journal still takes nothing after its failure
    with pytest.raises(DiskFull, match="takes no entry after its failed write"):
        j.append(entry(4))
    j.close()
    assert path.read_bytes() == before
    with Journal(path) as again:
        assert again.torn_bytes == 0 and set(again._keys) == {(f"r{i}", 0, 0, "default") for i in range(3)}


def test_another_write_error_cuts_the_line_too_but_is_raised_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append(entry(0))
        failing_writes(monkeypatch, path, errno.EIO)
        with pytest.raises(OSError) as failure:
            j.append(entry(1))
        assert failure.value.errno == errno.EIO and not isinstance(failure.value, DiskFull)
        with pytest.raises(OSError, match="takes no entry"):
            j.append(entry(2))
    assert [e["id"] for e in whole_lines(path)] == ["r0"]


def test_a_failed_fsync_cuts_back_to_the_last_good_one(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    j = Journal(path, sync_every=1000, sync_interval_s=3600)
    for i in range(2):
        j.append(entry(i))
    j.sync()
    synced = path.read_bytes()
    for i in range(2, 5):
        j.append(entry(i))
    real_fsync, to_journal = os.fsync, writes_to(path)

    def fsync(fd):
        if to_journal(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(journal_module.os, "fsync", fsync)
    with pytest.raises(DiskFull, match="the 3 entries written after the last good fsync") as failure:
        j.sync()
    assert str(path) in str(failure.value)
    assert path.read_bytes() == synced
    assert j.entry(("r1", 0)) is not None and j.entry(("r3", 0)) is None and j.reusable("f3") is None
    with pytest.raises(DiskFull, match="takes no entry"):
        j.append(entry(5))
    monkeypatch.undo()
    j.close()
    with Journal(path) as again:
        assert set(again._keys) == {("r0", 0, 0, "default"), ("r1", 0, 0, "default")}
