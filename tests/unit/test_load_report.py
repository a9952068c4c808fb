"""The load table and figure: retractions, prefix-cache hits and time queued from the rows, the
in-flight timelines from the generate jobs' provenance."""

import pandas as pd

from eagle3_datagen.steps.plot_load import plot_load
from eagle3_datagen.storage.tables import GENERATIONS_SCHEMA, Batching, TableWriter


def rows(n: int, *, retract_every: int, cached: int, queue: float, failed: int = 0):
    for i in range(n + failed):
        ok = i < n
        yield {
            "id": f"r{i}",
            "sample_index": 0,
            "turn": 0,
            "category": "c",
            "prompt_ids": [1] * 100,
            "output_ids": [2] * 10 if ok else [],
            "status": "ok" if ok else "failed",
            "cached_tokens": cached if ok else None,
            "num_retractions": (1 if retract_every and i % retract_every == 0 else 0) if ok else None,
            "queue_time": queue * (i % 2) if ok else None,
        }


def test_load_table_and_figure_per_category(tmp_path):
    timeline = {"t": [0.0, 0.5, 1.0], "in_flight": [8, 16, 12], "limit": [8, 16, 14], "running": [8, 14, 12],
                "waiting": [0, 2, 0]}  # fmt: skip
    paths = []
    for name, kwargs, provenance in (
        # One job, auto, the server reports queue times (--enable-metrics).
        ("math", dict(n=40, retract_every=10, cached=25, queue=0.2, failed=3),
         {"client": {"concurrency": "auto", "limit_mean": 12.7, "limit_max": 16, "requests_per_s": 4.0,
                     "load_endpoint": ["/v1/loads"], "timeline": timeline}}),
        # Two shards, fixed, one of them assembled from the journal alone (no client), no queue times.
        ("chat", dict(n=10, retract_every=0, cached=0, queue=0.0),
         {"shards": [{"client": {"concurrency": 16, "limit_mean": 16.0, "limit_max": 16, "requests_per_s": 2.0,
                                 "load_endpoint": [], "timeline": timeline}}, {}]}),
    ):  # fmt: skip
        path = tmp_path / f"{name}.parquet"
        with TableWriter(path, GENERATIONS_SCHEMA, Batching(rows=7)) as writer:
            writer.write(rows(**kwargs))
            writer.close(provenance)
        paths.append(path)
    frame = plot_load(
        categories=["math", "chat"],
        generations=paths,
        load_summary=tmp_path / "load.tsv",
        load_png=tmp_path / "load.png",
        batch={"rows": 7},
    )
    assert (tmp_path / "load.png").stat().st_size > 10_000
    table = pd.read_csv(tmp_path / "load.tsv", sep="\t").set_index("category")
    assert list(frame["category"]) == ["math", "chat"]
    math, chat = table.loc["math"], table.loc["chat"]
    # Only answered (ok) rows count: 40 of them, every tenth retracted once.
    assert (math["answered"], math["retractions"], math["rows_retracted"]) == (40, 4, 4)
    assert math["retractions_per_1000"] == 100.0
    assert math["cache_hit_share"] == 0.25 and math["prompt_tokens"] == 4000
    assert math["queue_time_mean_s"] == 0.1 and math["queue_time_p90_s"] == 0.2
    assert (math["concurrency"], math["limit_max"], math["load_endpoint"]) == ("auto", 16, "/v1/loads")
    assert chat["retractions"] == 0 and chat["cache_hit_share"] == 0.0
    assert pd.isna(chat["queue_time_mean_s"])  # not reported, not zero
    assert str(chat["concurrency"]) == "16" and chat["requests_per_s"] == 2.0
