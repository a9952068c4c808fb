"""build_demo_model: the demo's Kimi-shaped tokenizer and tiny CPU model, trained from packages.

Imports `demo.model` only.
"""

from pathlib import Path

from eagle3_datagen.demo.model import build_demo_model_dir


def build_demo_model(*, demo_weights: Path, demo_model: dict) -> Path:
    """Rule build_demo_model: the demo's tokenizer and tiny model, in the folder of `demo_weights`."""
    return build_demo_model_dir(demo_weights.parent, steps=int(demo_model["steps"]), seed=int(demo_model["seed"]))
