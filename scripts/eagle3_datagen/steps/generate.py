"""generate: one shard of a category through SGLang's native /generate (`generation.run`), and
merge_shards, which joins a category's shards into one table in prompt order.
"""

import itertools
import logging
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_datagen.generation.assemble import ASSEMBLE_COLUMNS, ShardRows, rows_of, sending_job
from eagle3_datagen.generation.planning import journal_path, open_journal, shard_of, shard_rows
from eagle3_datagen.generation.run import generate_category
from eagle3_datagen.quality.flags import QualitySettings
from eagle3_datagen.settings import ClientSettings, ModelProfile, stable_hash
from eagle3_datagen.storage.tables import (
    GENERATIONS_SCHEMA,
    Batching,
    TableWriter,
    count_rows,
    iter_batches,
    iter_rows,
    read_provenance,
)

log = logging.getLogger(__name__)


def generate(
    *,
    prompts: Path,
    shard_generations: Path,
    server_log: Path,
    category: str,
    shard: int,
    model: dict,
    sampling: dict,
    engine: dict,
    budget: dict,
    client: dict,
    max_failed_share: float,
    cache_dir: str,
    shards: int,
    may_send: bool = True,
    quality: dict | None = None,
) -> None:
    """Generate one shard of a category into `shard_generations` (`may_send=False`: only from the
    journal, on a host without the server: rule generate_cached). Memory follows the requests in
    flight and one batch of rows, not the rows done."""
    params = dict(locals())  # the step's parameters as given, for the provenance
    for key in ("prompts", "shard_generations", "server_log", "category", "shard", "may_send"):
        del params[key]
    started = time.monotonic()
    facts = read_provenance(prompts)
    label = category if shards == 1 else f"{category}[{shard}/{shards}]"

    def prompt_rows():
        return shard_rows(iter_rows(prompts, columns=ASSEMBLE_COLUMNS), shard, shards)

    journal_file = journal_path(cache_dir, category, shard, shards)
    with sending_job(journal_file, server_log, shard_generations) as (attempt_server_log, writer):
        provenance = generate_category(
            prompt_rows,
            facts=facts,
            profile=ModelProfile.from_config(model),
            sampling=sampling,
            engine=engine,
            budget=budget,
            client_settings=ClientSettings.from_config(client),
            journal=open_journal(cache_dir, category, shard, shards),
            server_log=attempt_server_log,
            max_failed_share=max_failed_share,
            category=label,
            writer=writer,
            may_send=may_send,
            quality=QualitySettings.from_config(quality),
            shard=(shard, shards),
        )
        provenance.update(
            {"prompts": facts, "params": params, "config_sha256": stable_hash(params), "shard": shard, "shards": shards}
        )
        # The job's time with its server (started, sending, stopped): what it held its GPUs for.
        provenance["job"]["wall_s"] = round(time.monotonic() - started, 3)
        writer.close(provenance)
    log.info("%s: wrote %d rows to %s", label, writer.rows, shard_generations)


def merge_shards(*, prompts: Path, shard_generations: list[Path], generations: Path, batch: dict | None = None) -> None:
    """Join a category's generate shards into one generations table, in prompt order.

    The merge walks the prompts table once and takes each run of rows from its shard as Arrow slices."""
    batching = Batching.from_config(batch)
    shards = len(shard_generations)
    provenance = [read_provenance(path) for path in shard_generations]
    for n, p in enumerate(provenance):
        if p.get("shard", n) != n or p.get("shards", shards) != shards:
            raise RuntimeError(
                f"{shard_generations[n]} holds shard {p.get('shard')} of {p.get('shards')}, not {n} of {shards}"
            )
    for path in shard_generations:
        missing = [name for name in GENERATIONS_SCHEMA.names if name not in pq.read_schema(path).names]
        if missing:  # written before these columns were: its journal re-makes it, resending only changed requests
            raise RuntimeError(
                f"{path} has no column {', '.join(missing)}: an older eagle3-datagen wrote it. Make it again "
                f"from its journal, which holds every row (none is sent again unless its request changed): "
                f"snakemake --forcerun {path}"
            )
    held = sum(count_rows(path) for path in shard_generations)
    expected = sum(
        rows_of(k) for keys in iter_batches(prompts, batching, columns=["status", "turn_ends"]) for k in keys
    )
    if held != expected:
        raise RuntimeError(f"{generations}: the shards hold {held} rows, the prompts table's turns {expected}")
    sources = [ShardRows(path, batching) for path in shard_generations]
    with TableWriter(generations, GENERATIONS_SCHEMA, batching) as writer:
        for keys in iter_batches(prompts, batching, columns=["id", "sample_index", "mode", "status", "turn_ends"]):
            owners = [(shard_of(k["id"], shards) if shards > 1 else 0, rows_of(k)) for k in keys]
            pieces = []
            for shard, run in itertools.groupby(owners, key=lambda o: o[0]):
                pieces += sources[shard].take(sum(n for _, n in run))
            table = pa.Table.from_batches(pieces)
            got = zip(*(table.column(c).to_pylist() for c in ("id", "sample_index", "mode")))
            expected_keys = ((k["id"], k["sample_index"], k["mode"]) for k in keys for _ in range(rows_of(k)))
            for k, found in zip(expected_keys, got):
                if found != k:
                    raise RuntimeError(
                        f"{generations}: prompt row {k[0]}.{k[1]}@{k[2]} meets shard row "
                        f"{found[0]}.{found[1]}@{found[2]}: the shards are not in prompt order"
                    )
            writer.write_arrow(table)
        writer.close({**provenance[0], "shards": provenance})
    log.info("merged %d shards, %d rows into %s", shards, writer.rows, generations)
