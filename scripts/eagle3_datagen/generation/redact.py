"""One rule for secrets in logs and provenance: a value is hidden when its name is a secret's name.

Whole names only: `api_key`, `admin_api_key`, `hf_token` and `--api-key` are secrets, while
`tokenizer_path`, `max_total_num_tokens` and `skip_tokenizer_init` are not (a substring match would
hide them and leave provenance unreadable).
"""

import re

MASK = "***"
_SECRET_NAME = re.compile(r"(^|_)(api_key|token|secret|password|passwd|authorization|credentials?)$", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True for a key or flag name that holds a secret (`--api-key` reads as `api_key`)."""
    return bool(_SECRET_NAME.search(str(name).lstrip("-").replace("-", "_")))


def redact(obj):
    """A copy of a JSON-like value with the values of secret-named keys hidden, at any depth."""
    if isinstance(obj, dict):
        return {k: (MASK if is_secret_name(k) and v else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def redact_command(cmd: list[str]) -> str:
    """A command line fit for a log: the values of secret flags (`--api-key X`, `--api-key=X`) hidden."""
    out, hide = [], False
    for arg in cmd:
        name, eq, _ = arg.partition("=")
        secret = not hide and name.startswith("--") and is_secret_name(name)
        out.append(MASK if hide else f"{name}={MASK}" if secret and eq else arg)
        hide = secret and not eq  # the value is the next argument
    return " ".join(out)
