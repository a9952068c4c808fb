"""What the engine reads from a model or tokenizer directory: the tokenizer, `config.json`, and the
set of ids that end generation as SGLang 0.5.23 builds it (`srt/configs/model_config.py`
`_get_hf_eos_token_id`, `utils/hf_transformers/common.py` `attach_additional_stop_token_ids`).

Imports nothing of the engine (transformers only when a tokenizer is loaded).
"""

import functools
import json
from pathlib import Path
from typing import Any

# Turn-final markers SGLang adds to the tokenizer's stop ids when its added vocabulary holds them
# (0.5.23 `utils/hf_transformers/common.py` `attach_additional_stop_token_ids`).
ADDITIONAL_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>", "<|ifm|im_end|>")


@functools.lru_cache(maxsize=8)
def load_tokenizer(tokenizer_dir: Path, trust_remote_code: bool = False):
    """A tokenizer per directory, loaded once per process (engines restarted in tests share it).

    `trust_remote_code` as SGLang's `--trust-remote-code`: Kimi's TikToken tokenizer is remote code."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code)


def read_config(model_dir: Path | None) -> dict[str, Any]:
    """The directory's `config.json` ({} without a directory or file)."""
    if model_dir is None:
        return {}
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def read_eos_token_ids(
    model_dir: Path | None, tokenizer_eos_id: int | None, added_vocab: dict[str, int] | None = None
) -> frozenset:
    """model_config._get_hf_eos_token_id plus what `Req._check_token_based_finish` adds from the
    tokenizer: its `eos_token_id` and `additional_stop_token_ids`.

    Union of config.json and generation_config.json `eos_token_id` (int or list), the tokenizer's
    eos id, and the additional turn-final markers found in its added vocabulary.
    """
    ids: set = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name if model_dir is not None else None
        if path is None or not path.is_file():
            continue
        value = json.loads(path.read_text()).get("eos_token_id")
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else value)
    if tokenizer_eos_id is not None:
        ids.add(int(tokenizer_eos_id))
    ids.update(added_vocab[text] for text in ADDITIONAL_STOP_TEXTS if text in (added_vocab or {}))
    return frozenset(int(i) for i in ids)
