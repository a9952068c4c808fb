"""build_demo_model: the demo's Kimi-shaped tokenizer and tiny CPU model, trained from packages."""

from pathlib import Path

from eagle3_datagen.demo.model import build_demo_model_dir
from eagle3_datagen.settings import DemoModelSettings


def build_demo_model(*, demo_weights: Path, demo_model: dict) -> Path:
    """Rule build_demo_model: the demo's tokenizer and tiny model, in the folder of `demo_weights`."""
    settings = DemoModelSettings.from_config(demo_model)
    return build_demo_model_dir(demo_weights.parent, steps=settings.steps, seed=settings.seed)
