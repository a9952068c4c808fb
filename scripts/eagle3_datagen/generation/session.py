"""The HTTP session every request of a client run goes through (`open_session`), and the event loop
the run goes on (`run_loop`).

Imports nothing of the package.
"""

import asyncio

import aiohttp

# A new connection that takes longer than this is a server that does not answer: retried.
CONNECT_TIMEOUT_S = 30.0


def open_session(headers: dict) -> aiohttp.ClientSession:
    """The session every request of a run goes through. Tuned for thousands of POSTs of JSON bytes to
    a few servers: no connection limit of its own (the client's slots bound what is in flight), no
    total or read timeout (a timer per request; `Deadlines` keeps them), no cookie jar, no
    compression asked for (SGLang answers plain JSON), and no proxy from the environment (a cluster's
    http_proxy is for the internet, not for the job's own server)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None),
        headers=headers,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
        timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=CONNECT_TIMEOUT_S),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


def run_loop(coro):
    """Run a coroutine of the client to its end: on uvloop's event loop (libuv, written in C: the
    event loop's own work per request is a fraction of asyncio's), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
