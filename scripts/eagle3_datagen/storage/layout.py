"""Where every file of a run lives, read by the rules and the command line alike: rules name their
files by these keys (`output: prompts=P["prompts"]`), and step functions take parameters of the same
names, so `eagle3_datagen.runner` hands a step its files from Snakemake's job or from this table."""

from pathlib import Path

PATHS = {
    # tokenize_prompts
    "prompts": "results/prompts/{category}.parquet",
    # plan_generation, preview_generation
    "plan": "results/plan/{category}/shard_{shard}.json",
    "preview": "results/plan.tsv",
    # generate, merge_shards
    "shard_generations": "results/generations/{category}/shard_{shard}.parquet",
    "cached_shard_generations": "results/generations/{category}/shard_{shard}.cached.parquet",
    "server_log": "logs/generate/{category}/shard_{shard}.server.log",
    "generations": "results/generations/{category}.parquet",
    # pilot_generate, project_pilot
    "pilot_generations": "results/pilot/{category}.parquet",
    "pilot_run": "results/pilot/{category}.json",
    "pilot_server_log": "logs/pilot_generate/{category}.server.log",
    "projection": "results/pilot/projection.tsv",
    "projection_png": "results/plots/projection.png",
    # check_sequences, check_parsers
    "sequence_report": "results/checks/{category}.sequences.json",
    "verdicts": "results/checks/{category}.parquet",
    "verdict_counts": "results/checks/{category}.json",
    # export_dataset, merge_dataset, vocab_mapping. Each trainer-ready folder holds trainer rows only,
    # each once: results/dataset/ (one JSONL per category) and results/train/ (the merged file).
    "dataset": "results/dataset/{category}.jsonl",
    "dataset_parquet": "results/parquet/{category}.parquet",
    "rejected": "results/rejected/{category}.jsonl",
    "train": "results/train/train.jsonl",
    "token_freq": "results/vocab/token_freq.pt",
    "vocab_mapping": "results/vocab/vocab_mapping.pt",
    "d2t": "results/vocab/d2t.npy",
    "t2d": "results/vocab/t2d.npy",
    "vocab_provenance": "results/vocab/provenance.json",
    # summarize, plot_checks
    "summary": "results/summary.tsv",
    "turns_summary": "results/turns.tsv",
    "turns_png": "results/plots/turns.png",
    "lengths_png": "results/plots/lengths.png",
    "verdicts_png": "results/plots/verdicts.png",
    "token_share_png": "results/plots/token_share.png",
    "finish_reasons_png": "results/plots/finish_reasons.png",
    # plot_quality
    "quality_png": "results/plots/quality.png",
    # plot_load
    "load_summary": "results/load.tsv",
    "load_png": "results/plots/load.png",
    "headline": "results/headline.html",  # headline: the report's first page
    # build_demo_model
    "demo_weights": "resources/demo_model/model.safetensors",
    "demo_tokenizer": "resources/demo_model/tokenizer_config.json",
}


def path(name: str, **wildcards) -> str:
    """One file of the table, e.g. path("plan", category="math", shard=0)."""
    return PATHS[name].format(**wildcards)


def journal_path(cache_dir, category: str, shard: int, shards: int) -> Path:
    """A shard's journal (`generation.journal`), under the config's `cache_dir`, outside results/."""
    return Path(cache_dir) / "journal" / category / f"shard_{shard}-of-{shards}.jsonl"
