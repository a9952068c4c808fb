"""A large category split into shards: one generate job (and server) per shard, merged in prompt order.
The runs ask for the merged generations, all this test reads (the checks and exports after them are
the whole-DAG tests' business)."""

import pytest
from workdir import Workdir, row_label

pytestmark = pytest.mark.slow


def prompts(n):
    return [
        {"id": f"big-{i:03d}", "messages": [{"role": "user", "content": f"Summarize fact number {i}."}]}
        for i in range(n)
    ]


def test_shards_generate_apart_and_merge_in_prompt_order(tmp_path, qwen3_tokenizer_dir):
    from eagle3_datagen.generation.planning import shard_of
    from eagle3_datagen.storage.tables import read_provenance, read_rows

    wd = Workdir(
        tmp_path,
        tokenizer=qwen3_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"big": prompts(30)},
        plain_qwen3=True,
    )
    sheet = wd.path / "config" / "categories.tsv"
    sheet.write_text("category\tprompts\tshards\nbig\tconfig/prompts/big.jsonl\t3\n")
    wd.snakemake("--cores", "2", "results/generations/big.parquet")

    for shard in range(3):
        rows = read_rows(wd.path / "results" / "generations" / "big" / f"shard_{shard}.parquet")
        assert rows and all(shard_of(r["id"], 3) == shard for r in rows)
    merged = read_rows(wd.path / "results" / "generations" / "big.parquet")
    assert [r["id"] for r in merged] == [f"big-{i:03d}" for i in range(30)]
    assert len(read_provenance(wd.path / "results" / "generations" / "big.parquet")["shards"]) == 3
    record = wd.engine_record("big")
    assert sorted(row_label(r["rid"]) for r in record) == [f"big-{i:03d}.0" for i in range(30)]
    assert len({r["rid"].rsplit(".", 2)[1] for r in record}) == 3  # three clients, three servers

    # Another shard count moves rows between jobs, but every answer is already in the cache.
    sheet.write_text("category\tprompts\tshards\nbig\tconfig/prompts/big.jsonl\t2\n")
    wd.snakemake("--cores", "2", "results/generations/big.parquet")
    assert len(wd.engine_record("big")) == 30
    assert [r["output_ids"] for r in read_rows(wd.path / "results" / "generations" / "big.parquet")] == [
        r["output_ids"] for r in merged
    ]
