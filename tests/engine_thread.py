"""The local engine's app served inside the test process: from a thread, for code that talks HTTP
synchronously (the client, the generate step: `running_engine`), or on the test's own event loop
with aiohttp's test client (`serve`)."""

import asyncio
import threading
import time
import urllib.request
from contextlib import contextmanager

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from eagle3_datagen.engine.app import create_app

STARTUP_TIMEOUT_S = 300


@contextmanager
def running_engine(backend, *, context_length=4096, faults=None, record=None, **app_kwargs):
    """Yield the base URL of a healthy engine serving `backend`; stopped on exit (`app_kwargs` go to
    create_app: incremental_streaming_output, stream_interval, loops, ...)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def start():
        app = create_app(
            backend,
            context_length=context_length,
            model_path="m",
            tokenizer_path="t",
            record_path=record,
            faults=faults,
            **app_kwargs,
        )
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def serve():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(30)
    url = state["url"]
    # A model backend imports torch and transformers and loads its weights first: on a loaded 2-core
    # machine, beside a real SGLang server starting, that has taken over a minute.
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the in-process engine did not become healthy within {STARTUP_TIMEOUT_S} s")
        time.sleep(0.05)
    try:
        yield url
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def serve(backend, fn, *, context_length: int, **app_kwargs):
    """Run `await fn(client)` (an aiohttp TestClient) against the app of `backend` on a loopback port,
    once the backend is ready; `app_kwargs` go to create_app (record_path, faults, enable_metrics, ...)."""

    async def main():
        app = create_app(backend, context_length=context_length, model_path="m", tokenizer_path="t", **app_kwargs)
        async with TestServer(app, host="127.0.0.1") as server:
            async with TestClient(server) as client:
                deadline = time.monotonic() + STARTUP_TIMEOUT_S
                while (await client.get("/health")).status != 200:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"engine never became healthy within {STARTUP_TIMEOUT_S} s")
                    await asyncio.sleep(0.05)
                return await fn(client)

    return asyncio.run(main())
