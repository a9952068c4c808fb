"""The command lines and environment of the servers a generate job launches (`servers` runs them):
SGLang's `launch_server` from `engine.sglang`, with `engine.sglang.env` on top of the job's
environment, and the CPU stand-in engine.
"""

import logging
import os
import shlex
import sys

from eagle3_datagen.engine_settings import EngineSettings, without_flag

log = logging.getLogger(__name__)


# Each streamed chunk holds only the tokens new since the one before (else every chunk repeats the
# whole output so far): what the live loop stop needs (`streaming`).
INCREMENTAL_STREAMING_FLAG = "--incremental-streaming-output"


def sglang_command(
    engine: EngineSettings | dict,
    *,
    port: int,
    context_length: int,
    api_key: str | None = None,
    incremental_streaming: bool = False,
    host: str | None = None,
) -> list[str]:
    """`python -m sglang.launch_server ...` from the config, listening on `port` of `host` (the
    server's: `--host` of extra_args, else localhost), which the command gives once."""
    settings = EngineSettings.of(engine)
    sglang = settings.server
    extra = without_flag(sglang.extra_args, "host")
    cmd = [
        sglang.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        sglang.model_path,
        "--tp-size",
        str(sglang.tp_size),
        *_listening(port, context_length, sglang.host if host is None else host),
    ]
    if sglang.trust_remote_code:
        cmd.append("--trust-remote-code")
    if settings.deterministic_inference:
        cmd.append("--enable-deterministic-inference")
    if sglang.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(sglang.mem_fraction_static)]
    if api_key:
        cmd += ["--api-key", api_key]
    if incremental_streaming and INCREMENTAL_STREAMING_FLAG not in extra:
        cmd.append(INCREMENTAL_STREAMING_FLAG)
    return cmd + extra


def node_args(engine: EngineSettings | dict, *, rank: int, dist_init_addr: str) -> list[str]:
    """The flags that make a launch one rank of a server across `engine.sglang.nodes` nodes."""
    sglang = EngineSettings.of(engine).server
    args = ["--nnodes", str(sglang.nodes), "--node-rank", str(rank), "--dist-init-addr", dist_init_addr]
    if sglang.dist_timeout_s is not None:
        args += ["--dist-timeout", str(sglang.dist_timeout_s)]
    return args


def api_key(engine: EngineSettings | dict) -> str | None:
    """The server's API key, from the environment variable the config names (never from the config)."""
    name = EngineSettings.of(engine).api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise RuntimeError(f"engine.api_key_env names {name}, but that environment variable is not set")
    return key


def server_env(extra) -> dict:
    """The launched server's environment: the job's own, with `engine.sglang.env` (a mapping, or
    its (name, value) pairs) on top, values as text. Only the names are logged: values may hold
    credentials."""
    env = dict(os.environ)
    extra = dict(extra)
    for name, value in extra.items():
        env[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    if extra:
        log.info("server environment from engine.sglang.env: %s", ", ".join(sorted(map(str, extra))))
    return env


# Extra arguments for the local engine, from the environment: how tests inject latency, faults
# and a request record (`--error-rate 0.1 --record-dir DIR`, see `python -m eagle3_datagen.engine
# -h`) into the engines that generate jobs launch, without a switch in the user's config.
LOCAL_ENGINE_ARGS_ENV = "EAGLE3_DATAGEN_ENGINE_ARGS"


def _listening(port: int, context_length: int, host: str = "127.0.0.1") -> list[str]:
    """Where a launched server listens (localhost unless the config says otherwise, the job's free
    port) and its context: the same flags for SGLang and the stand-in engine."""
    return ["--host", host, "--port", str(port), "--context-length", str(context_length)]


def local_engine_command(
    engine: EngineSettings | dict,
    *,
    port: int,
    context_length: int,
    tokenizer: str,
    trust_remote_code: bool = False,
    incremental_streaming: bool = False,
) -> list[str]:
    """The command line of the CPU stand-in engine (python -m eagle3_datagen.engine)."""
    settings = EngineSettings.of(engine)
    local = settings.server
    cmd = [
        sys.executable,
        "-m",
        "eagle3_datagen.engine",
        "--backend",
        local.backend,
        "--model-dir",
        str(local.model_dir or tokenizer),
        "--tokenizer-dir",
        str(tokenizer),
        *_listening(port, context_length),
        "--max-batch",
        str(local.max_batch),
    ]
    if trust_remote_code:  # as the model profile says, like SGLang's --trust-remote-code
        cmd.append("--trust-remote-code")
    if settings.deterministic_inference:
        cmd.append("--enable-deterministic-inference")
    if incremental_streaming:
        cmd.append(INCREMENTAL_STREAMING_FLAG)
    cmd += list(local.extra_args)
    return cmd + shlex.split(os.environ.get(LOCAL_ENGINE_ARGS_ENV, ""))
