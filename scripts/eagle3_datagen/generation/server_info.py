"""What a server says of itself: `/server_info` and `/model_info` (as SGLang 0.5.23 names them, else
the older `/get_...` forms), the context it really serves, the start-up checks of its flags
against the config (refusing a server that would corrupt data), what of it is recorded as
provenance (secrets hidden), and its load (`/v1/loads`).

Imports `answers` (SGLang's error shapes), `load` (reading a load answer) and `redact`.
"""

import asyncio
import json
import logging

import aiohttp
import orjson

from eagle3_datagen.generation.answers import error_text
from eagle3_datagen.generation.load import Load, parse_loads
from eagle3_datagen.generation.redact import redact
from eagle3_datagen.settings import ModelProfile

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 5.0


async def fetch_info(base_url: str, name: str, *, headers: dict | None = None) -> dict:
    """`/server_info` or `/model_info` as 0.5.23 names them, else (on 404) the older `/get_...` form,
    which 0.5.23 still serves, logging a deprecation warning for each call."""
    async with aiohttp.ClientSession() as session:
        for older in (False, True):
            url = f"{base_url}/{'get_' * older}{name}"
            async with session.get(url, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=30.0)) as resp:
                text = await resp.text()
                if resp.status == 200:
                    return json.loads(text)
                if resp.status != 404 or older:
                    raise RuntimeError(f"GET {url}: {error_text(resp.status, text)}")


# SGLang's scheduler admits prompts shorter than max_req_input_len = min(context, KV pool) - 1 - 5
# (tp_worker.py, 0.5.23): the context a server really serves is that plus 6.
MAX_REQ_INPUT_MARGIN = 6


def served_context(info: dict) -> int | None:
    """The context the server serves: its --context-length (null when it was not given) and, where
    reported, the smaller limit its KV pool sets (max_req_input_len); None when it reports neither."""
    margins = {"context_length": 0, "max_req_input_len": MAX_REQ_INPUT_MARGIN}
    return min((int(info[k]) + m for k, m in margins.items() if info.get(k) is not None), default=None)


def check_server_info(info: dict, *, context_length: int, url: str) -> list[str]:
    """Start-up checks of /server_info against the config. Raises on what would corrupt data (a server
    whose answers carry no text, --skip-tokenizer-init, is refused by `identity.check_model_info`)."""
    if info.get("allow_auto_truncate"):
        raise RuntimeError(f"{url} runs with --allow-auto-truncate: it would silently cut prompts; refusing to use it")
    server_context = served_context(info)
    if server_context is None:
        raise RuntimeError(
            f"{url} reports neither context_length nor max_req_input_len, so the prompts sized for "
            f"model.context_length {context_length} cannot be checked against it; start it with --context-length"
        )
    if server_context < context_length:
        raise RuntimeError(
            f"{url} serves a context of {server_context} tokens, but model.context_length is {context_length}: "
            "requests sized for the config would be rejected"
        )
    return [
        f"{url} runs with --{flag.replace('_', '-')} {info[flag]}: it only affects the OpenAI chat "
        "layer, not /generate, but a server for this pipeline needs none"
        for flag in ("reasoning_parser", "tool_call_parser")
        if info.get(flag)
    ]


def streams_incrementally(info: dict) -> bool:
    """Whether a server's streamed chunks hold only the tokens new since the chunk before (SGLang's
    --incremental-streaming-output, /server_info `incremental_streaming_output`). Without it every
    chunk repeats the whole output so far: streaming a long answer from it costs its square."""
    return bool(info.get("incremental_streaming_output"))


class LoadReader:
    """The servers' load, summed over them: `/v1/loads`, else the older `/get_load` (the first that
    answers is kept per server; a server with neither is not asked again)."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.paths: dict[str, str | None] = {}  # the load endpoint each server answers, None: none

    async def _read_one(self, session: aiohttp.ClientSession, url: str) -> Load | None:
        for path in [self.paths[url]] if url in self.paths else ["/v1/loads", "/get_load"]:
            try:
                async with session.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)) as resp:
                    if resp.status != 200:
                        continue
                    load = parse_loads(orjson.loads(await resp.read()))
                    self.paths[url] = path
                    return load
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("%s%s: %s", url, path, exc)
        self.paths.setdefault(url, None)
        return None

    async def read(self, session: aiohttp.ClientSession) -> Load | None:
        """None when a server has no load endpoint or does not answer (none is asked once none has one)."""
        if all(self.paths.get(url, "") is None for url in self.urls):
            return None
        total = None
        for url in self.urls:
            load = await self._read_one(session, url)
            if load is None:
                return None
            total = load if total is None else total + load
        return total


def seeds_honoured(infos: dict) -> bool:
    """Whether every server honoured the requests' sampling_seed: only with --enable-deterministic-inference."""
    return bool(infos) and all(bool(i["server_info"].get("enable_deterministic_inference")) for i in infos.values())


def server_provenance(urls: list[str], profile: ModelProfile, headers: dict) -> dict:
    """Each server's /server_info and /model_info (secrets hidden), after the start-up checks."""

    async def read(url: str) -> dict:
        server_info = await fetch_info(url, "server_info", headers=headers)
        for warning in check_server_info(server_info, context_length=profile.context_length, url=url):
            log.warning(warning)
        model_info = await fetch_info(url, "model_info", headers=headers)
        return {"server_info": redact(server_info), "model_info": redact(model_info)}

    return {url: asyncio.run(read(url)) for url in urls}
