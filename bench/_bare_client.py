"""The bare floor for client_speed.py: the least a /generate client can do, and so the rate any client must beat.

asyncio + aiohttp, an asyncio.Semaphore(concurrency), one POST /generate per prompt with
{input_ids, sampling_params, rid}, `await resp.json()`, the output_ids kept. No retries, no journal,
no checks, no output file. Prints its figures as one JSON line on stdout. With `--orjson` the answer is
parsed by orjson.loads(await resp.read()) instead (aiohttp's resp.json() is the standard library's json):
a stricter floor for long answers.

    .venv/bin/python bench/_bare_client.py REQUESTS_JSON URL --max-new-tokens N [--concurrency 64] [--orjson]
"""

import time

T_IMPORTS = time.monotonic()  # before the imports below: the process's start, near enough

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402

import aiohttp  # noqa: E402


async def run(url: str, prompts: list[list[int]], sampling: dict, concurrency: int, loads=None) -> dict:
    slots = asyncio.Semaphore(concurrency)
    outputs: list[list[int] | None] = [None] * len(prompts)
    stamps: list[float] = []
    cpus: list[float] = []
    first: list[float] = []

    async def one(session: aiohttp.ClientSession, i: int, ids: list[int]) -> None:
        async with slots:
            if not first:
                first.append(time.monotonic())
            body = {"input_ids": ids, "sampling_params": sampling, "rid": f"bare-{i}"}
            async with session.post(f"{url}/generate", json=body) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                data = loads(await resp.read()) if loads else await resp.json()
                outputs[i] = data["output_ids"]
        stamps.append(time.monotonic())
        cpus.append(time.process_time())

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i, ids) for i, ids in enumerate(prompts)))
    return {"stamps": stamps, "cpus": cpus, "first_send": first[0], "tokens": sum(len(o) for o in outputs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("requests", help="JSON file: {'input_ids': [[...], ...], 'sampling': {...}}")
    parser.add_argument("url")
    parser.add_argument("--max-new-tokens", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--orjson", action="store_true", help="parse answers with orjson instead of resp.json()")
    parser.add_argument("--t-spawn", type=float, help="time.monotonic() when the process was started")
    args = parser.parse_args()
    with open(args.requests) as fh:
        spec = json.load(fh)
    sampling = {**spec["sampling"], "max_new_tokens": args.max_new_tokens}
    loads = None
    if args.orjson:
        import orjson

        loads = orjson.loads
    cpu0, t0 = time.process_time(), time.monotonic()
    out = asyncio.run(run(args.url.rstrip("/"), spec["input_ids"], sampling, args.concurrency, loads))
    cpu1, t1 = time.process_time(), time.monotonic()
    out.update(
        client="bare-orjson" if args.orjson else "bare",
        requests=len(spec["input_ids"]),
        t_spawn=args.t_spawn or T_IMPORTS,
    )
    out.update(t_start=t0, t_end=t1, cpu_run_s=cpu1 - cpu0, cpu_process_s=cpu1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
