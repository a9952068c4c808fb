"""The generate journal: resumable, keyed by (id, sample_index), torn tails recovered."""

import json

from eagle3_datagen.generation.journal import Journal


def entry(i, status="ok", fingerprint=None):
    fingerprint = fingerprint or f"f{i}"
    return {"id": f"r{i}", "sample_index": 0, "fingerprint": fingerprint, "status": status, "output_ids": [i, 7]}


def test_entries_survive_a_reopen(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        for i in range(5):
            j.append(entry(i))
    with Journal(path) as j:
        assert set(j.entries) == {(f"r{i}", 0, 0, "default") for i in range(5)}
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
        assert set(j.entries) == {("r0", 0, 0, "default"), ("r1", 0, 0, "default"), ("r2", 0, 0, "default")}
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
        assert j.entries[("r1", 0)]["status"] == "ok"


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
        assert set(j.entries) == {("c", 0, 0, "default"), ("c", 0, 1, "default")}
        assert j.entry(("c", 0))["output_ids"] == [1]  # a key without a turn is turn 0
        assert j.entry(("c", 0, 1))["output_ids"] == [2] and j.reusable("f1")["turn"] == 1
