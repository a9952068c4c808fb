"""The trainer row: what SpecForge and speculators read from a dataset line (`input_ids` and
`loss_mask`, the loss on the model's output), with the row's identity beside them. Written by
export_dataset, measured by the pilot (its bytes project the dataset's size)."""

from eagle3_datagen.settings import DEFAULT_MODE


def dataset_row(
    row: dict, spans: list[tuple[int, int]] | None = None, turns: int = 1, flags: list[str] | None = None
) -> dict:
    """The trainer row of a generated turn: `input_ids = prompt_ids + output_ids`, the loss on the
    output. A merged row (`spans`): the last turn's sequence, the loss on each merged turn's output."""
    prompt, output = row["prompt_ids"], row["output_ids"]
    input_ids = prompt + output
    if spans is None:
        spans = [(len(prompt), len(input_ids))]
    mask = [0] * len(input_ids)
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    n_loss = sum(end - start for start, end in spans)
    if len(mask) != len(input_ids) or sum(mask) != n_loss or not output or spans[-1][1] != len(input_ids):
        raise AssertionError(f"loss_mask contract broken for {row['id']}.{row['sample_index']} turn {row['turn']}")
    return {
        "input_ids": input_ids,
        "loss_mask": mask,
        "id": row["id"],
        "sample_index": int(row["sample_index"]),
        "turn": int(row["turn"]) - turns + 1,
        "mode": row.get("mode") or DEFAULT_MODE,
        "turns": turns,
        "category": row["category"],
        "finish_type": row["finish_type"],
        "n_prompt_tokens": len(input_ids) - n_loss,
        "n_output_tokens": n_loss,
        "seed": int(row["seed"]),
        "flags": list(row.get("flags") or ()) if flags is None else flags,
    }
