"""Client speed: the project's generate job, speculators' regenerate client and a bare aiohttp client,
side by side in one run, against the same zero-cost server; the figures that count are the ratios.

The server is the local engine (`python -m eagle3_datagen.engine --backend scripted`, Qwen3
tokenizer) with `--answer-tokens N:N`; every request sends
`ignore_eos: true` and `max_new_tokens: N`, so every answer is exactly N tokens (checked). The
server is pinned to one core and each client to the other (`taskset`); each client runs in a fresh
process of its own, reads the same pre-tokenized prompts (~300 tokens, the demo prompts' user texts
through the Qwen3 chat template, made once by the pipeline's tokenize_prompts) and reports its own
figures as JSON on stdout. Per output length the three run alternately (ABC ABC ABC) against one
engine, after a warm-up that is not counted. --requests prompts per run (2,000), except at 32,768
output tokens and more: --long-requests (400; speculators' client needs ~7 s for those already).

The clients:
  bare         bench/_bare_client.py: asyncio + aiohttp, a Semaphore(concurrency), POST /generate with
               {input_ids, sampling_params, rid}, `await resp.json()`, the output_ids kept. The floor.
  speculators  speculators 0.9.0's own code (`speculators/cli/regenerate_responses.py`, loaded from its
               unpacked wheel by path; `datasets`, and `openai` when it is missing, are stand-ins, since
               nothing of theirs that runs here calls them). Theirs: `_worker` (the worker pool, the
               per-conversation `samples`, the JSON rows written with json.dumps(ensure_ascii=False) and
               flushed, the stats, the tqdm postfix and update), `_post_chat` with `with_retries`,
               `build_boundary_sample`, `build_detokenizer` (their AutoTokenizer load of the local Qwen3
               tokenizer directory: no hub), `prepare_row`, `_primary_identifier`, `extract_tools`,
               `_log_summary`, and the body of `_run` after its dataset is loaded, as written there: the
               queue of concurrency x 4, the aiohttp session with their connector, timeout and headers,
               the output and error files, tqdm, the `concurrency` worker tasks, the feeding loop and the
               None sentinels. Replaced: the module-level `regenerate_conversation` (theirs posts a chat
               completion to vLLM and reads `choices`), by one that posts one /generate payload
               {input_ids, sampling_params (theirs with max_new_tokens), rid} through the `post_fn` it is
               given and appends one sample shaped as `_sample_from_response` shapes it (id, primary_id,
               input_ids + loss_mask from `build_boundary_sample`, text = their detokenize of the ids,
               metadata); the HF dataset, by the same rows as a list ({id, messages}); and tqdm, by a
               subclass whose `update` also notes the completion time.
  project      the pipeline's generate job, every feature on, in-process: `eagle3_datagen.steps.generate.generate`
               on a prompts table made by tokenize_prompts, with an external engine: planning against
               the journal, the server checks and provenance, the client with journal (flushed, fsync'd
               in batches), retries, progress logging to the job's log file, and the Parquet generations
               table. A completion is stamped by a wrapper around `Journal.append`; the first request by
               a wrapper around aiohttp's `ClientSession.post` (removed after the first /generate).
  bare-orjson  (only with --clients) the bare client parsing answers with orjson: a stricter floor.

Figures, per client and run:
  steady req/s     requests completed between the 10 % and 90 % completion marks over the time between
                   them (the client's own completion stamps): start-up and tail do not count;
  CPU ms/req       time.process_time of the client's process between the same two marks, per request
                   ("steady"), and over the whole run call ("run": for the project, generate() from
                   planning to the table written; for speculators, their orchestration; for bare,
                   asyncio.run); every thread of the process counts;
  server busy      the engine's CPU time over the same window (sampled every 50 ms): near 100 %, the
                   server, not the client, sets the rate;
  start-up         from the process's start (the parent's clock just before spawning it) and, for the
                   project, from calling generate(), until the first request is handed to aiohttp; the
                   server is already healthy. The project's goal: within 2 s. Whether torch got imported
                   in the project's process is reported too.
Ratios are project / bare and project / speculators per repeat (the three of a repeat ran back to
back), median and min-max. Goals, set by the real limit (a GPU server answers a few to a few hundred
requests a second; an 8-GPU Kimi-K2.5 server about one ~10k-token answer a second): the project's
steady CPU at most 1 ms per request at 4,096 output tokens (1,000 answers a second on one core), and
its rate at least 2x speculators' at 256 and 4,096. The bare client is the floor to read against, not
a goal. Last, one more project run at --profile-length under cProfile (not counted), its top
functions by tottime.

    .venv/bin/python bench/client_speed.py [--requests 2000] [--long-requests 400] [--repeats 3]
        [--lengths 256,4096,32768] [--concurrency 64] [--clients bare,speculators,project]
        [--out /tmp/client_speed.json] [--profile-length 4096]

(The same file is also each client's process: `--worker speculators|project`.)
"""

import time

T_IMPORTS = time.monotonic()  # before any import: the process's start, near enough

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from contextlib import contextmanager, nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

from _harness import ROOT, BenchParser, require, write_figures  # noqa: E402

BENCH = ROOT / "bench"
sys.path.insert(0, str(ROOT / "scripts"))

SPECULATORS = ROOT / ".cache" / "trainers" / "speculators-0.9.0"
SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
CONTEXT_LENGTH = 40960  # 32,768 output tokens and a ~300-token prompt fit
CLIENTS = ("bare", "speculators", "project", "bare-orjson")


# ---------------------------------------------------------------------------------------------------
# The clients' processes
# ---------------------------------------------------------------------------------------------------


def load_speculators():
    """speculators.cli.regenerate_responses from the unpacked wheel, by path, without the package's
    __init__ files (they import the training stack); stand-ins for modules imported but not called."""
    import importlib.util
    import types

    root = SPECULATORS / "speculators"
    for name, path in (
        ("speculators", root),
        ("speculators.data_generation", root / "data_generation"),
        ("speculators.cli", root / "cli"),
    ):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    datasets = types.ModuleType("datasets")  # `load_dataset`: only in their _run, not called here
    datasets.load_dataset = None
    sys.modules.setdefault("datasets", datasets)
    try:
        import openai  # noqa: F401  (their vLLM client's types; nothing here calls it)
    except ImportError:
        names = {
            "openai": ("AsyncClient", "Client"),
            "openai.types": (),
            "openai.types.chat": ("ChatCompletion", "ChatCompletionMessageParam"),
            "openai.types.completion": ("Completion",),
        }
        for name, attrs in names.items():
            stub = types.ModuleType(name)
            stub.__path__ = []
            for attr in attrs:
                setattr(stub, attr, type(attr, (), {}))
            sys.modules[name] = stub
    name = "speculators.cli.regenerate_responses"
    spec = importlib.util.spec_from_file_location(name, root / "cli" / "regenerate_responses.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def speculators_worker(args, setup: dict) -> dict:
    import asyncio
    from pathlib import Path

    regen = load_speculators()
    import aiohttp
    from speculators.data_generation.configs import DatasetConfig
    from tqdm import tqdm

    with open(setup["requests"]) as fh:
        spec = json.load(fh)
    prompts, texts = spec["input_ids"], spec["texts"]
    sampling, max_tokens, concurrency = spec["sampling"], args.max_new_tokens, args.concurrency
    endpoint = f"{setup['url']}/generate"
    model = setup["tokenizer"]
    stamps: list[float] = []
    cpus: list[float] = []
    first: list[float] = []

    async def regenerate_conversation(
        post_fn,
        item,
        *,
        model,
        max_tokens,
        endpoint,
        sampling_params,
        samples,
        detokenize,
        reasoning_effort=None,
        temperature=None,
    ) -> bool:
        """One /generate request per conversation, in place of their chat-completion turn loop."""
        payload = {
            "input_ids": item["input_ids"],
            "sampling_params": {**sampling_params, "max_new_tokens": max_tokens},
            "rid": f"{item['primary_id']}.{len(samples)}",
        }
        if not first:
            first.append(time.monotonic())
        data = await post_fn(payload)
        meta = data["meta_info"]
        completion = data["output_ids"]
        input_ids, loss_mask = regen.build_boundary_sample(item["input_ids"], completion)
        samples.append(
            {
                "id": f"{item['primary_id']}_gen{len(samples)}",
                "primary_id": item["primary_id"],
                "input_ids": input_ids,
                "loss_mask": loss_mask,
                "text": detokenize(input_ids),
                "metadata": {
                    "idx": item["idx"],
                    "finish_reason": meta["finish_reason"]["type"],
                    "is_tool_call": False,
                    "usage": {
                        "prompt_tokens": meta.get("prompt_tokens", len(item["input_ids"])),
                        "completion_tokens": meta.get("completion_tokens", len(completion)),
                    },
                    "endpoint": endpoint,
                    "sampling_params": sampling_params,
                },
            }
        )
        return False

    regen.regenerate_conversation = regenerate_conversation

    class StampedTqdm(tqdm):
        def update(self, n=1):
            stamps.append(time.monotonic())
            cpus.append(time.process_time())
            return super().update(n)

    detokenize = regen.build_detokenizer(model)
    config = DatasetConfig(name="bench", hf_path=setup["requests"], split="train", prompt_field="prompt")
    work = Path(setup["work"])
    outfile, error_outfile = str(work / "regenerated.jsonl"), str(work / "regenerated.errors.jsonl")
    rows = [{"id": f"p-{i:05d}", "messages": [{"role": "user", "content": t}]} for i, t in enumerate(texts)]

    async def run() -> dict:
        # The body of their `_run` after the dataset is loaded.
        queue: asyncio.Queue = asyncio.Queue(maxsize=concurrency * 4)
        regen.ensure_parent_dirs(outfile, error_outfile)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=90, sock_read=None)
        connector = aiohttp.TCPConnector(limit=0, force_close=False, enable_cleanup_closed=True)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers) as session:
            with (
                Path(outfile).open("a", encoding="utf-8") as output_file,
                Path(error_outfile).open("a", encoding="utf-8") as error_file,
                StampedTqdm(
                    total=len(rows), desc="Generating responses", unit="sample", dynamic_ncols=True
                ) as progress,
            ):
                stats = {
                    "ok": 0,
                    "errors": 0,
                    "truncated": 0,
                    "requests": 0,
                    "completion_tokens": 0,
                    "total_request_s": 0.0,
                    "start_time": time.perf_counter(),
                }
                workers = [
                    asyncio.create_task(
                        regen._worker(
                            session,
                            queue,
                            model=model,
                            max_tokens=max_tokens,
                            endpoint=endpoint,
                            sampling_params=sampling,
                            max_retries=regen.DEFAULT_MAX_RETRIES,
                            out_fh=output_file,
                            err_fh=error_file,
                            progress=progress,
                            stats=stats,
                            detokenize=detokenize,
                        )
                    )
                    for _ in range(concurrency)
                ]
                for index, row in enumerate(rows):
                    normalized, turns, tool_results = regen.prepare_row(row, config)
                    queue_item = {
                        "idx": index,
                        "primary_id": regen._primary_identifier(row),
                        "turns": turns,
                        "tools": regen.extract_tools(normalized),
                        "tool_results": tool_results,
                        "input_ids": prompts[index],  # the pre-tokenized prompt, for the /generate body
                    }
                    await queue.put(queue_item)
                for _ in range(len(workers)):
                    await queue.put(None)
                await asyncio.gather(*workers)
                regen._log_summary(stats)
        return stats

    cpu0, t0 = time.process_time(), time.monotonic()
    stats = asyncio.run(run())
    cpu1, t1 = time.process_time(), time.monotonic()
    if stats["errors"]:
        raise RuntimeError(f"{stats['errors']} conversations failed; see {error_outfile}")
    return {
        "stamps": stamps,
        "cpus": cpus,
        "first_send": first[0],
        "tokens": stats["completion_tokens"],
        "requests": stats["ok"],
        "t_start": t0,
        "t_end": t1,
        "cpu_run_s": cpu1 - cpu0,
    }


def project_worker(args, setup: dict) -> dict:
    import aiohttp

    import eagle3_datagen.generation.client  # noqa: F401  (the client's imports counted with the others)
    from eagle3_datagen.generation.journal import Journal
    from eagle3_datagen.steps.generate import generate
    from eagle3_datagen.storage.tables import read_provenance
    from eagle3_datagen.workflow import setup_logging

    t_imported = time.monotonic()
    work = Path(setup["work"])
    setup_logging(work / "generate.log")  # as the rule's job does: its log file
    stamps: list[float] = []
    cpus: list[float] = []
    first: list[float] = []
    real_append, real_post = Journal.append, aiohttp.ClientSession.post

    def append(self, entry):
        real_append(self, entry)
        stamps.append(time.monotonic())
        cpus.append(time.process_time())

    def post(self, url, *a, **kw):
        if not first and str(url).endswith("/generate"):
            first.append(time.monotonic())
            aiohttp.ClientSession.post = real_post
        return real_post(self, url, *a, **kw)

    Journal.append = append
    aiohttp.ClientSession.post = post
    table = work / "results" / "generations" / "bench" / "shard_0.parquet"
    kwargs = dict(
        prompts=Path(setup["prompts"]),
        shard_generations=table,
        server_log=work / "logs" / "generate.server.log",
        category="bench",
        shard=0,
        model=setup["model"],
        sampling=setup["sampling"],
        engine={"kind": "external", "external": {"urls": [setup["url"]]}},
        budget=setup["budget"],
        client={**setup["client"], "concurrency": args.concurrency},
        max_failed_share=0.0,
        cache_dir=str(work / "cache"),
        shards=1,
    )
    profile = None
    if args.profile:
        import cProfile

        profile = cProfile.Profile(time.process_time)  # CPU time: waits in epoll do not count
    cpu0, t_call = time.process_time(), time.monotonic()
    if profile is not None:
        profile.enable()
    generate(**kwargs)
    if profile is not None:
        profile.disable()
    cpu1, t1 = time.process_time(), time.monotonic()
    if profile is not None:
        import io
        import pstats

        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.profile_top)
        Path(args.profile).write_text(text.getvalue())
    done = read_provenance(table)["client"]
    return {
        "stamps": stamps,
        "cpus": cpus,
        "first_send": first[0],
        "tokens": done["output_tokens"],
        "requests": done["requests"],
        "t_imported": t_imported,
        "t_call": t_call,
        "t_start": t_call,
        "t_end": t1,
        "cpu_run_s": cpu1 - cpu0,
        "torch_imported": "torch" in sys.modules,
        "transformers_imported": "transformers" in sys.modules,
    }


def worker_main(args) -> None:
    setup = json.loads(Path(args.setup).read_text())
    out_stream = sys.stdout
    sys.stdout = sys.stderr  # whatever the client prints goes to its log; stdout carries the JSON only
    run = speculators_worker if args.worker == "speculators" else project_worker
    out = run(args, setup)
    out.update(client=args.worker, t_spawn=args.t_spawn or T_IMPORTS, cpu_process_s=time.process_time())
    print(json.dumps(out), file=out_stream, flush=True)


# ---------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------


def build_inputs(tok_dir: Path, tmp: Path, counts: dict[int, int], model: dict, prompt_tokens: int) -> dict:
    """Per output length, the prompts table (tokenize_prompts) and the same prompts as a JSON file."""
    from transformers import AutoTokenizer

    from client_load import demo_texts
    from eagle3_datagen.steps.tokenize_prompts import tokenize_prompts
    from eagle3_datagen.storage.tables import iter_rows

    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    pool = demo_texts()
    texts = []
    for i in range(max(counts.values())):
        parts, k = [f"Request {i}."], i
        while sum(len(p) for p in parts) < prompt_tokens * 5:
            parts.append(pool[k % len(pool)])
            k += 7
        ids = tokenizer.encode("\n\n".join(parts), add_special_tokens=False)[: prompt_tokens - 10]
        texts.append(tokenizer.decode(ids))
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    sampling = {
        **SAMPLING,
        "ignore_eos": True,
        "stop_token_ids": stop,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    inputs = {}
    for length, n in counts.items():
        source = tmp / f"prompts-{length}.jsonl"
        with open(source, "w") as fh:
            for i, text in enumerate(texts[:n]):
                fh.write(json.dumps({"id": f"p-{i:05d}", "messages": [{"role": "user", "content": text}]}) + "\n")
        table = tmp / f"prompts-{length}.parquet"
        budget = {"max_new_tokens": length, "min_new_tokens": 16, "reserve_tokens": 2}
        tokenize_prompts(
            source=source,
            prompts=table,
            category="bench",
            model=model,
            budget=budget,
            samples_per_prompt=1,
            seed=0,
            on_bad_rows="fail",
        )
        rows = list(iter_rows(table, columns=["prompt_ids", "max_new_tokens", "status"]))
        assert len(rows) == n and all(r["status"] == "ok" and r["max_new_tokens"] == length for r in rows)
        requests = tmp / f"requests-{length}.json"
        requests.write_text(
            json.dumps({"input_ids": [r["prompt_ids"] for r in rows], "texts": texts[:n], "sampling": sampling})
        )
        inputs[length] = {
            "prompts": str(table),
            "requests": str(requests),
            "budget": budget,
            "n": n,
            "prompt_tokens": statistics.mean(len(r["prompt_ids"]) for r in rows),
        }
    return inputs


def engine(tok_dir: Path, port: int, log_dir: Path, length: int, core: int):
    from eagle3_datagen.generation.servers import ManagedServer

    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "eagle3_datagen.engine", "--backend", "scripted"]
    cmd += ["--model-dir", str(tok_dir), "--tokenizer-dir", str(tok_dir), "--port", str(port)]
    cmd += ["--context-length", str(CONTEXT_LENGTH), "--answer-tokens", f"{length}:{length}", "--log-level", "WARNING"]
    return ManagedServer(cmd, port=port, log_path=log_dir / f"engine-{length}.log")


class ServerMeter:
    """The engine's CPU time (its processes, every thread), sampled every `interval_s` by a thread of this
    process (on the server's core): how busy the server was in a client's steady window."""

    def __init__(self, server, interval_s: float = 0.05):
        import psutil

        self.procs = psutil.Process(server.proc.pid).children(recursive=True)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []

    def cpu(self) -> float:
        total = 0.0
        for proc in self.procs:
            times = proc.cpu_times()
            total += times.user + times.system
        return total

    @contextmanager
    def running(self):
        import threading

        self.samples = []
        stop = threading.Event()

        def sample():
            while True:
                self.samples.append((time.monotonic(), self.cpu()))
                if stop.wait(self.interval_s):
                    self.samples.append((time.monotonic(), self.cpu()))
                    return

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()


def spawn(
    client: str,
    setup: dict,
    length: int,
    args,
    core: int,
    tmp: Path,
    profile: Path | None = None,
    meter: ServerMeter | None = None,
) -> dict:
    """One client run in a fresh process pinned to `core`; its JSON figures (and the server's CPU samples)."""
    work = Path(tempfile.mkdtemp(prefix=f"{client}-{length}-", dir=tmp))
    setup = {**setup, "work": str(work)}
    (work / "setup.json").write_text(json.dumps(setup))
    if client.startswith("bare"):
        cmd = [str(BENCH / "_bare_client.py"), setup["requests"], setup["url"]]
        cmd += ["--orjson"] if client == "bare-orjson" else []
    else:
        cmd = [str(Path(__file__).resolve()), "--worker", client, "--setup", str(work / "setup.json")]
        cmd += ["--profile", str(profile)] if profile else []
    cmd += ["--max-new-tokens", str(length), "--concurrency", str(args.concurrency)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    log = tmp / f"{client}-{length}.log"
    with open(log, "ab") as err, meter.running() if meter else nullcontext():
        t = time.monotonic()
        proc = subprocess.run(
            ["taskset", "-c", str(core), sys.executable, *cmd, "--t-spawn", repr(t)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            timeout=args.run_timeout,
        )
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{client} at {length} tokens exited with {proc.returncode}; the end of its log:\n{tail}")
    shutil.rmtree(work, ignore_errors=True)
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    n = setup["n"]
    if out["requests"] != n or out["tokens"] != n * length or len(out["stamps"]) != n:
        raise RuntimeError(
            f"{client} at {length} tokens: {out['requests']} requests, {out['tokens']} tokens, "
            f"{len(out['stamps'])} completions; expected {n} of exactly {length} tokens each"
        )
    if meter:
        out["server_cpu"] = meter.samples
    return out


def at(samples: list[tuple[float, float]], t: float) -> float:
    """A sampled counter (time, value) at time t, interpolated."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / max(t1 - t0, 1e-9)
    return samples[-1][1] if t > samples[-1][0] else samples[0][1]


def figures(out: dict) -> dict:
    """Steady rate and CPU between the 10 % and 90 % completion marks, start-up, whole-run figures."""
    order = sorted(range(len(out["stamps"])), key=out["stamps"].__getitem__)
    stamps = [out["stamps"][i] for i in order]
    cpus = [out["cpus"][i] for i in order] if "cpus" in out else None
    n = len(stamps)
    a, b = -(-n // 10) - 1, (9 * n) // 10 - 1  # indices of the 10 % and 90 % completions
    span = stamps[b] - stamps[a]
    fig = {
        "steady_rps": (b - a) / span,
        "steady_s": span,
        "overall_rps": n / (stamps[-1] - out["first_send"]),
        "cpu_ms_run": out["cpu_run_s"] / n * 1000,
        "wall_run_s": out["t_end"] - out["t_start"],
        "startup_process_s": out["first_send"] - out["t_spawn"],
    }
    if out.get("server_cpu"):
        fig["server_busy_steady"] = (at(out["server_cpu"], stamps[b]) - at(out["server_cpu"], stamps[a])) / span
    if cpus is not None:
        fig["cpu_ms_steady"] = (max(cpus[a : b + 1]) - min(cpus[a : b + 1])) / (b - a) * 1000
    if "t_call" in out:
        fig["startup_call_s"] = out["first_send"] - out["t_call"]
        fig["imports_s"] = out["t_imported"] - out["t_spawn"]
        fig["torch_imported"] = out["torch_imported"]
    return fig


def spread(values: list[float], fmt: str, unit: str = "") -> str:
    med, lo, hi = (format(v, fmt) + unit for v in (statistics.median(values), min(values), max(values)))
    return f"{med} ({lo}–{hi})"


def report(results: dict, args, inputs: dict) -> list[str]:
    # The real limit is the GPU's rate (an 8-GPU Kimi-K2.5 server answers about one ~10k-token request a
    # second): at most 1 ms of the client's CPU per 4,096-token answer is 1,000 answers a second on one
    # core; and at least twice the rate of speculators' client where the client is what is measured.
    goals = {256: {"speculators": 2.0}, 4096: {"speculators": 2.0}}
    cpu_goals = {4096: 1.0}
    lines = []
    for length, runs in results.items():
        n = inputs[length]["n"]
        lines.append(
            f"### {length:,} output tokens: {n:,} requests, ~{inputs[length]['prompt_tokens']:.0f}-token prompts, "
            f"concurrency {args.concurrency}, median (min–max) of {len(runs['project'])}"
        )
        lines.append("")
        lines.append(
            "| client | steady req/s | project / client | CPU ms/req, steady | CPU ms/req, run | server core busy, "
            "steady | run wall s | first request after process start s |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for client in args.clients:
            figs = [figures(r) for r in runs[client]]
            ratio = "1.00×"
            if client != "project":
                per = [p["steady_rps"] / f["steady_rps"] for p, f in zip((figures(r) for r in runs["project"]), figs)]
                ratio = spread(per, ".2f", "×")
                median_ratio = statistics.median(per)
                goal = goals.get(length, {}).get(client)
                if goal is not None:
                    ratio += f", goal ≥ {goal:.1f}×: {'met' if median_ratio >= goal else 'NOT met'}"
            cpu = spread([f["cpu_ms_steady"] for f in figs], ".3f")
            if client == "project" and length in cpu_goals:
                met = statistics.median(f["cpu_ms_steady"] for f in figs) <= cpu_goals[length]
                cpu += f", goal ≤ {cpu_goals[length]:.1f} ms: {'met' if met else 'NOT met'}"
            lines.append(
                f"| {client} | {spread([f['steady_rps'] for f in figs], '.1f')} | {ratio} | "
                f"{cpu} | {spread([f['cpu_ms_run'] for f in figs], '.3f')} | "
                f"{spread([f['server_busy_steady'] * 100 for f in figs], '.0f', ' %')} | "
                f"{spread([f['wall_run_s'] for f in figs], '.1f')} | {spread([f['startup_process_s'] for f in figs], '.2f')} |"
            )
        lines.append("")
    project = [figures(r) for runs in results.values() for r in runs["project"]]
    torch_seen = sorted({f["torch_imported"] for f in project})
    lines.append(f"### Start-up of the project client ({len(project)} runs; the server already healthy)")
    lines.append("")
    lines.append(
        f"- process start → first request: {spread([f['startup_process_s'] for f in project], '.2f')} s (goal ≤ 2 s)"
    )
    lines.append(
        f"- of which imports (process start → imports done): {spread([f['imports_s'] for f in project], '.2f')} s"
    )
    lines.append(f"- generate() called → first request: {spread([f['startup_call_s'] for f in project], '.3f')} s")
    lines.append(f"- torch imported in the project's process: {', '.join('yes' if t else 'no' for t in torch_seen)}")
    lines.append("")
    lines.append(
        f"Server: local engine, scripted backend, "
        f"pinned to core {args.cores[0]}; clients pinned to core {args.cores[1]}. 'steady': between the 10 % and 90 % "
        "completion marks; 'project / client': the project's steady req/s over that client's, per repeat."
    )
    return lines


SMOKE = {"requests": 24, "long_requests": 8, "repeats": 1, "lengths": "256", "concurrency": 8}
SMOKE |= {"warmup": 8, "profile_length": 0, "run_timeout": 120, "out": "/tmp/client_speed-smoke.json"}


def headline(results: dict, counts: dict) -> dict:
    """Per output length: each client's median steady req/s and CPU ms per request, and the project's
    rate over each other client's (the median of the per-repeat ratios)."""
    out = {}
    for length, runs in results.items():
        figs = {client: [figures(r) for r in reps] for client, reps in runs.items()}
        per = {
            client: {
                "steady_rps": round(statistics.median(f["steady_rps"] for f in fs), 2),
                "cpu_ms_steady": round(statistics.median(f["cpu_ms_steady"] for f in fs), 4),
            }
            for client, fs in figs.items()
        }
        for client, fs in figs.items():
            if client != "project":
                ratios = [p["steady_rps"] / f["steady_rps"] for p, f in zip(figs["project"], fs)]
                per[client]["project_over_client"] = round(statistics.median(ratios), 3)
        out[str(length)] = {"requests": counts[length], **per}
    return out


def main() -> None:
    parser = BenchParser(__doc__, smoke=SMOKE)
    parser.add_argument("--requests", type=int, default=2000, help="requests per run below 32,768 output tokens")
    parser.add_argument("--long-requests", type=int, default=400, help="requests per run at 32,768 output tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lengths", default="256,4096,32768", help="output tokens of every answer, per length")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--clients",
        default="bare,speculators,project",
        help=f"in the order they alternate; of {', '.join(CLIENTS)} (bare-orjson: the bare client parsing with orjson)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=200, help="requests of the bare client before the runs")
    parser.add_argument("--cores", default=None, help="SERVER,CLIENT cores (default: the first two allowed)")
    parser.add_argument("--profile-length", type=int, default=4096, help="cProfile one more project run (0: none)")
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument("--run-timeout", type=float, default=600)
    parser.add_argument("--out", default="/tmp/client_speed.json")
    # A client's own process:
    parser.add_argument("--worker", choices=("speculators", "project"), help=argparse.SUPPRESS)
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    parser.add_argument("--max-new-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--t-spawn", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return

    from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir
    from eagle3_datagen.generation.servers import free_port
    from eagle3_datagen.settings import defaults

    allowed = sorted(os.sched_getaffinity(0))
    args.cores = [int(c) for c in args.cores.split(",")] if args.cores else allowed[:2]
    if len(args.cores) != 2 or args.cores[0] == args.cores[1]:
        raise SystemExit(f"two distinct cores are needed (allowed here: {allowed})")
    os.sched_setaffinity(0, {args.cores[0]})  # this process only waits; it keeps off the client's core
    lengths = [int(x) for x in args.lengths.split(",")]
    args.clients = args.clients.split(",")
    if "project" not in args.clients or not set(args.clients) <= set(CLIENTS):
        raise SystemExit(f"--clients: some of {', '.join(CLIENTS)}, the project among them")
    if "speculators" in args.clients:
        require(SPECULATORS / "speculators" / "cli" / "regenerate_responses.py", "speculators' wheel", "oracles")
    counts = {length: args.long_requests if length >= 32768 else args.requests for length in lengths}
    tok_dir = qwen3_tokenizer_dir()
    model = defaults(
        "model",
        name="qwen3-bench",
        tokenizer=str(tok_dir),
        context_length=CONTEXT_LENGTH,
        stop_tokens=["<|im_end|>"],
        reasoning_end="</think>",
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
    )
    client = defaults("client", concurrency=args.concurrency)
    started = time.monotonic()
    results: dict[int, dict[str, list[dict]]] = {}
    profile_text = ""
    with tempfile.TemporaryDirectory(prefix="client_speed-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = build_inputs(tok_dir, tmp, counts, model, args.prompt_tokens)
        print(f"prompts built in {time.monotonic() - started:.1f} s", flush=True)
        for length in lengths:
            setup = {
                "requests": inputs[length]["requests"],
                "prompts": inputs[length]["prompts"],
                "budget": inputs[length]["budget"],
                "model": model,
                "sampling": {**SAMPLING, "ignore_eos": True},
                "client": client,
                "tokenizer": str(tok_dir),
                "n": inputs[length]["n"],
            }
            results[length] = {c: [] for c in args.clients}
            server = engine(tok_dir, free_port(), tmp, length, args.cores[0])
            with server as url:
                setup["url"] = url
                meter = ServerMeter(server)
                warm = tmp / f"warmup-{length}.json"
                spec = json.loads(Path(setup["requests"]).read_text())
                warm.write_text(json.dumps({**spec, "input_ids": spec["input_ids"][: args.warmup]}))
                spawn_warm = {**setup, "requests": str(warm), "n": len(spec["input_ids"][: args.warmup])}
                if args.warmup:
                    spawn("bare", spawn_warm, length, args, args.cores[1], tmp)
                for rep in range(args.repeats):
                    for c in args.clients:
                        out = spawn(c, setup, length, args, args.cores[1], tmp, meter=meter)
                        results[length][c].append(out)
                        f = figures(out)
                        print(
                            f"{length:>6} tokens, repeat {rep + 1}, {c:12} steady {f['steady_rps']:8.1f} req/s, "
                            f"CPU {f['cpu_ms_steady']:.3f} ms/req, server busy {f['server_busy_steady']:.0%}, "
                            f"run {f['wall_run_s']:.1f} s "
                            f"[{time.monotonic() - started:.0f} s]",
                            flush=True,
                        )
                if length == args.profile_length:
                    profile = tmp / "project.prof.txt"
                    spawn("project", setup, length, args, args.cores[1], tmp, profile=profile)
                    profile_text = profile.read_text()
    lines = report(results, args, inputs)
    print()
    print("\n".join(lines))
    if profile_text:
        print()
        print(
            f"### cProfile of one more project run at {args.profile_length:,} tokens (not counted), top {args.profile_top} by tottime"
        )
        print()
        print(profile_text.strip())
    raw = {
        "args": {
            k: v for k, v in vars(args).items() if k not in ("worker", "setup", "max_new_tokens", "t_spawn", "profile")
        },
        "prompt_tokens": {length: inputs[length]["prompt_tokens"] for length in lengths},
        "requests": counts,
        "runs": {
            length: {c: [{**figures(r), "raw": r} for r in runs[c]] for c in args.clients}
            for length, runs in results.items()
        },
        "profile": profile_text,
        "elapsed_s": time.monotonic() - started,
    }
    Path(args.out).write_text(json.dumps(raw, default=str))
    print(f"\nraw figures: {args.out}; whole run {time.monotonic() - started:.0f} s")
    write_figures(args, {"lengths": headline(results, counts), "elapsed_s": round(time.monotonic() - started)})


if __name__ == "__main__":
    main()
