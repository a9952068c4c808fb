"""A TikToken tokenizer in the format of Kimi-K2.5's (a test fixture of eagle3-datagen).

It loads only with trust_remote_code: a `tiktoken.model` rank file (base64 bytes and rank per line),
a slow `PreTrainedTokenizer` over `tiktoken.Encoding` (no tokenizer.json, no backend_tokenizer), and
256 special ids after the ranks, of which the named ones come from `added_tokens_decoder`. Like
Kimi's, `encode` matches special-token text unless told not to, and `apply_chat_template` turns
`tools` into a TypeScript-style declaration passed to the template as `tools_ts_str`.
"""

import base64
import json
import os
from shutil import copyfile

import tiktoken
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
NUM_SPECIAL = 256
PATTERN = (
    r"""[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def bytes_to_unicode():
    """GPT-2's byte-to-printable-character map (the token strings of byte-level BPE vocabularies)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _ts_type(schema):
    kind = schema.get("type")
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if kind == "array":
        return f"{_ts_type(schema.get('items') or {})}[]"
    if kind == "object" and schema.get("properties"):
        return "{" + ", ".join(f"{k}: {_ts_type(v)}" for k, v in schema["properties"].items()) + "}"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}.get(kind, "any")


def tools_to_typescript(tools):
    """A TypeScript-style declaration of OpenAI tools (namespace functions { type name = (...) => any; })."""
    lines = ["# Tools", "", "## functions", "namespace functions {"]
    for tool in tools:
        fn = tool.get("function", tool)
        if fn.get("description"):
            lines.append(f"// {fn['description']}")
        params = fn.get("parameters") or {}
        required = set(params.get("required") or [])
        fields = []
        for name, prop in (params.get("properties") or {}).items():
            if prop.get("description"):
                fields.append(f"// {prop['description']}")
            fields.append(f"{name}{'' if name in required else '?'}: {_ts_type(prop)},")
        body = "\n".join(fields)
        lines.append(
            f"type {fn['name']} = (_: {{\n{body}\n}}) => any;" if fields else f"type {fn['name']} = () => any;"
        )
    lines.append("}")
    return "\n".join(lines)


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, bos_token="[BOS]", eos_token="[EOS]", unk_token=None, pad_token=None,
                 additional_special_tokens=None, added_tokens_decoder=None, **kwargs):  # fmt: skip
        names = {int(i): t.content for i, t in (added_tokens_decoder or {}).items()}
        self.vocab_file = vocab_file
        ranks = read_ranks(vocab_file)
        base = len(ranks)
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + NUM_SPECIAL)}
        self.model = tiktoken.Encoding(
            name="kimi-fixture", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {v: k for k, v in byte_encoder.items()}
        self.decoder = {}
        for i in range(self.model.n_vocab):
            self.decoder[i] = "".join(byte_encoder[b] for b in self.model.decode_single_token_bytes(i))
        self.encoder = {v: k for k, v in self.decoder.items()}
        self.unk_id = self.special_tokens.get(str(unk_token)) if unk_token else None
        if additional_special_tokens is None:
            additional_special_tokens = [
                "<|im_end|>",
                "<|im_user|>",
                "<|im_assistant|>",
                "<|im_system|>",
                "<|im_middle|>",
            ]
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=additional_special_tokens, added_tokens_decoder=added_tokens_decoder,
                         **kwargs)  # fmt: skip

    def encode(self, text, allow_special_tokens=True, **kwargs):
        # Like Kimi's: with other arguments it is transformers' encode (which splits on added tokens
        # and calls _tokenize); alone, it is tiktoken, matching special-token text by default.
        if kwargs:
            return super().encode(text, **kwargs)
        if allow_special_tokens:
            return self.model.encode(text, allowed_special="all")
        return self.model.encode(text, disallowed_special=())

    def decode(self, token_ids, **kwargs):
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        return bytearray(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        out = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            copyfile(self.vocab_file, out)
        return (out,)

    def apply_chat_template(self, conversation, tools=None, tokenize=True, add_generation_prompt=False, **kwargs):
        if tools:
            kwargs.setdefault("tools_ts_str", tools_to_typescript(tools))
        return super().apply_chat_template(
            conversation, tools=tools, tokenize=tokenize, add_generation_prompt=add_generation_prompt, **kwargs
        )
