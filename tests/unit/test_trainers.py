"""The handoff: the trainers' own data code reads the export unchanged (SpecForge 0.2.0's
pre-tokenized prompt path, speculators 0.9.0's pass-through of pre-tokenized rows), and the draft
vocabulary is the one speculators would build from our token frequencies.

The trainers' modules are loaded from their wheels (tests/sglang_oracles.py installs them), by
path, without their packages' __init__ (which import GPU stacks); the only stand-ins are modules
the code under test never calls (`datasets`, speculators' vLLM render client)."""

import importlib
import importlib.util
import json
import sys
import types

import numpy as np
import pytest

from conftest import conversations
from eagle3_datagen.engine.scripted import ScriptedBackend
from eagle3_datagen.settings import defaults
from eagle3_datagen.steps.export_dataset import export_dataset, merge_dataset
from eagle3_datagen.steps.generate import generate
from eagle3_datagen.steps.vocab_mapping import vocab_mapping
from engine_thread import running_engine
from sglang_oracles import trainer

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
BUDGET = {"max_new_tokens": 64, "min_new_tokens": 4, "reserve_tokens": 2}
MAX_LENGTH = 120


def load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def speculators():
    """speculators' preprocessing and vocab_mapping modules, imported as its package lays them out."""
    root = trainer("speculators")
    saved = dict(sys.modules)
    package = types.ModuleType("speculators")
    package.__path__ = [str(root)]
    sys.modules["speculators"] = package
    for sub in ("data_generation", "train"):
        module = types.ModuleType(f"speculators.{sub}")
        module.__path__ = [str(root / sub)]
        sys.modules[f"speculators.{sub}"] = module
    datasets = types.ModuleType("datasets")  # only used by functions this test does not call
    datasets.Dataset, datasets.concatenate_datasets, datasets.load_dataset = object, None, None
    sys.modules.setdefault("datasets", datasets)
    render = types.ModuleType("speculators.data_generation.render_client")  # vLLM's /render: not called
    render.render_conversation = None
    sys.modules["speculators.data_generation.render_client"] = render
    try:
        yield (
            importlib.import_module("speculators.data_generation.preprocessing"),
            importlib.import_module("speculators.train.vocab_mapping"),
        )
    finally:  # the stand-ins and speculators' own modules go. Real libraries imported on the way
        # (torch.distributed, transformers' models) stay: a module whose import registers operators
        # with torch cannot be imported a second time in one process.
        for name in set(sys.modules) - set(saved):
            if name == "datasets" or name == "speculators" or name.startswith("speculators."):
                del sys.modules[name]


@pytest.fixture(scope="module")
def export(tmp_path_factory, qwen3_tokenizer_dir):
    """A category of 1- to 3-turn conversations, generated, exported (merge_turns, a max_length),
    merged and counted, in-process."""
    from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts

    root = tmp_path_factory.mktemp("handoff")
    rows = conversations(30)
    for i, row in enumerate(rows):
        for k in range(i % 3):
            row["messages"] += [{"role": "assistant", "content": "Yes."}, {"role": "user", "content": f"And {k}?"}]
    source = root / "cat.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = defaults(
        "model",
        name="qwen3-test",
        tokenizer=str(qwen3_tokenizer_dir),
        context_length=4096,
        stop_tokens=["<|im_end|>"],
        reasoning_end="</think>",
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
    )
    prompts = root / "prompts.parquet"
    tokenize_prompts(
        source=source,
        prompts=prompts,
        category="cat",
        model=model,
        budget=BUDGET,
        samples_per_prompt=1,
        seed=7,
        on_bad_rows="quarantine",
        turns="all",
    )
    with running_engine(ScriptedBackend(str(qwen3_tokenizer_dir))) as url:
        generate(
            prompts=prompts,
            shard_generations=root / "gen.parquet",
            server_log=root / "server.log",
            category="cat",
            shard=0,
            model=model,
            sampling=SAMPLING,
            engine=defaults("engine", kind="external", external={"urls": [url]}),
            budget=BUDGET,
            client={"concurrency": 4},
            max_failed_share=0.0,
            cache_dir=str(root / "cache"),
            shards=1,
        )
    export_config = {"merge_turns": True, "draft_vocab_size": 64, "filters": {"max_length": MAX_LENGTH}}
    export_dataset(
        generations=root / "gen.parquet",
        dataset=root / "dataset" / "cat.jsonl",
        dataset_parquet=root / "parquet" / "cat.parquet",
        rejected=root / "rejected" / "cat.jsonl",
        export=export_config,
    )
    merge_dataset(dataset=[root / "dataset" / "cat.jsonl"], train=root / "train" / "train.jsonl")
    vocab = root / "vocab"
    files = {name: vocab / name for name in ("token_freq.pt", "vocab_mapping.pt", "d2t.npy", "t2d.npy")}
    vocab_mapping(
        train=root / "train" / "train.jsonl",
        prompts=[prompts],
        token_freq=files["token_freq.pt"],
        vocab_mapping=files["vocab_mapping.pt"],
        d2t=files["d2t.npy"],
        t2d=files["t2d.npy"],
        export=export_config,
    )
    return root, files


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_export_keeps_trainer_rows_apart_and_filters_what_a_trainer_would_cut(export):
    root, _ = export
    assert sorted(p.name for p in (root / "dataset").iterdir()) == ["cat.jsonl"]  # only trainer rows
    assert sorted(p.name for p in (root / "train").iterdir()) == ["train.jsonl"]
    rows = lines(root / "dataset" / "cat.jsonl")
    assert rows and all(len(r["input_ids"]) <= MAX_LENGTH for r in rows)
    too_long = [r for r in lines(root / "rejected" / "cat.jsonl") if "export.filters.max_length" in r["reason"]]
    assert too_long and all(r["status"] == "filtered" for r in too_long)


def test_specforge_reads_every_row_unchanged(export):
    root, _ = export
    builder = load_file("specforge_prompt_builder", trainer("specforge") / "data" / "prompt_builder.py")
    for path in (root / "train" / "train.jsonl", root / "dataset" / "cat.jsonl"):
        tasks = builder.prepare_prompt_tasks(
            path,
            None,
            chat_template=None,
            max_length=MAX_LENGTH,
            is_preformatted=False,
            train_only_last_turn=False,
            cache_dir=None,
            cache_key=None,
            num_proc=None,
        )
        ours = lines(path)
        assert len(tasks) == len(ours)
        for task, row in zip(tasks, ours):
            assert task["payload"]["input_ids"] == row["input_ids"] and task["payload"]["loss_mask"] == row["loss_mask"]


def test_speculators_passes_every_row_through_unchanged(export, speculators):
    root, _ = export
    preprocessing, _ = speculators
    ours = lines(root / "train" / "train.jsonl")
    batch = {"input_ids": [r["input_ids"] for r in ours], "loss_mask": [r["loss_mask"] for r in ours]}
    out = preprocessing._passthrough_pretokenized(batch, MAX_LENGTH, minimum_valid_tokens=1)
    assert len(out["input_ids"]) == len(ours)
    for ids, mask, row in zip(out["input_ids"], out["loss_mask"], ours):
        assert ids.tolist() == row["input_ids"] and mask.tolist() == row["loss_mask"]


def test_the_draft_vocabulary_is_the_one_speculators_builds_and_specforge_loads(export, speculators):
    import torch  # here, not at the top: a test process that does not run this test never imports it

    root, files = export
    _, vocab = speculators
    freq = torch.load(files["token_freq.pt"])
    assert isinstance(freq, dict) and all(isinstance(k, int) and isinstance(v, int) for k, v in freq.items())
    # The counts are the loss tokens of train.jsonl, as both trainers count them.
    counted = {}
    for row in lines(root / "train" / "train.jsonl"):
        for token, m in zip(row["input_ids"], row["loss_mask"]):
            if m:
                counted[token] = counted.get(token, 0) + 1
    assert freq == counted
    target = len(np.load(files["t2d.npy"]))
    d2t, t2d = vocab.build_vocab_mappings_from_distribution(freq, 64, target)
    assert np.array_equal(np.load(files["d2t.npy"]), d2t.numpy()) and np.array_equal(
        np.load(files["t2d.npy"]), t2d.numpy()
    )
    mapping = torch.load(files["vocab_mapping.pt"])
    assert mapping["d2t"].dtype == torch.int64 and mapping["t2d"].dtype == torch.bool
    assert mapping["d2t"].shape == (64,) and mapping["t2d"].shape == (target,)
    # SpecForge's consistency rule: the draft ids, shifted by d2t, are exactly the ids t2d marks.
    assert torch.equal(torch.nonzero(mapping["t2d"]).flatten(), mapping["d2t"] + torch.arange(64))
    # More draft slots than distinct loss tokens: padded with the lowest unused ids, as speculators pads.
    many = len(freq) + 10
    from eagle3_datagen.steps.vocab_mapping import draft_vocabulary

    counts = np.zeros(target, dtype=np.int64)
    for token, n in freq.items():
        counts[token] = n
    ours_d2t, ours_t2d = draft_vocabulary(counts, many)
    theirs_d2t, theirs_t2d = vocab.build_vocab_mappings_from_distribution(freq, many, target)
    assert np.array_equal(ours_d2t, theirs_d2t.numpy()) and np.array_equal(ours_t2d, theirs_t2d.numpy())
