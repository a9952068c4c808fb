"""The loop detector's whole labelled corpus (tests/quality_corpus.py) on both tokenizers: three loops
per budget (2k, 4k, 32k), onset class, period (1-256) and swap rate, against the legitimate text of
ShareGPT's first 1,500 conversations (whole, and cut where a budget could cut them), the written
repetition and the tables, lists, code blocks and repeated lines of those real answers."""

import pytest

from eagle3_datagen.quality.loops import LoopSettings
from quality_corpus import rates, tokenizer_named

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["qwen3", "kimi"])
def test_recall_on_every_class_and_no_legitimate_text_flagged(name):
    report = rates(tokenizer_named(name), LoopSettings(), per_class=3)
    for source, found in report["legitimate"].items():
        assert found["rows"] and not found["flagged"] and not found["stopped_live"], source
    for key, cls in report["loops"].items():
        onset, rate = key.split(" onset, ")
        if onset != "late_any" and int(rate.split("%")[0]) <= 5:
            assert cls["flagged"] >= 0.95 * cls["loops"], (key, cls)
            assert cls["stopped_live"] >= 0.95 * cls["live"], (key, cls)
