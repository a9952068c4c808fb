"""Run the local engine: `python -m eagle3_datagen.engine --model-dir DIR --port N ...` (-h).

Serves SGLang's native HTTP API on CPU. Logs to stderr. Stops on SIGTERM/SIGINT, and by itself
when its parent process dies (a watch on the parent, polled every second), so that no engine
outlives the job that started it.

Two modes of the scripted backend for load tests: `--canned` makes the engine far cheaper per
request than any client (one answer, prepared once, for every request), and
`--max-running-requests R --max-total-tokens K` puts a simulated GPU of that capacity behind it
(`capacity.scheduler.KVScheduler`, paced by `--step-ms`, `--step-ms-per-request`, `--step-us-per-kv-token`,
`--prefill-us-per-token`).

Streams as SGLang's `--incremental-streaming-output` and `--stream-interval` ask; `--loop-share F`
(with `--loop-onset`, `--loop-period`) makes a share of requests fall into repetition loops on purpose.

The entry point of the engine: imports `settings` and every module of the engine (lazily, so that
`-h` answers at once).
"""

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

log = logging.getLogger("eagle3_datagen.engine")


def _range(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(":")
    lo_f = float(lo)
    hi_f = float(hi) if hi else lo_f
    if hi_f < lo_f or lo_f < 0:
        raise argparse.ArgumentTypeError(f"expected LO:HI with 0 <= LO <= HI, got {text!r}")
    return lo_f, hi_f


def _rate(text: str) -> float:
    p = float(text)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return p


def build_parser(prog: str = "python -m eagle3_datagen.engine") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="A CPU stand-in for an SGLang server (native /generate API).",
    )
    _add_server_options(p)
    _add_fault_options(p)
    _add_backend_options(p)
    _add_loop_options(p)
    _add_capacity_options(p)
    _add_run_options(p)
    return p


def _add_server_options(p: argparse.ArgumentParser) -> None:
    """What to serve and where, and the record of requests served."""
    p.add_argument("--model-dir", type=Path, required=True, help="model (or tokenizer) directory")
    p.add_argument("--tokenizer-dir", type=Path, help="tokenizer directory (default: --model-dir)")
    p.add_argument("--backend", choices=("model", "scripted"), default="model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--context-length", type=int, required=True)
    p.add_argument("--trust-remote-code", action="store_true", help="load a tokenizer that ships its own code")
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="honour each request's sampling_seed (as SGLang does only with this flag)",
    )
    p.add_argument("--record", type=Path, help="append one JSON line per served request here")
    p.add_argument("--record-dir", type=Path, help="like --record, to DIR/<pid>.jsonl (one file per engine)")


def _add_fault_options(p: argparse.ArgumentParser) -> None:
    """Injected faults of `/generate` (`server.faults.Faults`)."""
    p.add_argument("--latency-ms", type=_range, help="added latency LO:HI in ms, uniform")
    p.add_argument("--error-rate", type=_rate, default=0.0, help="probability of HTTP 500/503")
    p.add_argument("--reset-rate", type=_rate, default=0.0, help="probability of a reset")
    p.add_argument("--hang-rate", type=_rate, default=0.0, help="probability of never answering")
    p.add_argument("--fail-rids", help="regex: matching rids always get HTTP 500")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault RNG")


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    """The backends' batch and the scripted backend's answers."""
    p.add_argument("--max-batch", type=int, default=16, help="rows decoded together (model)")
    p.add_argument(
        "--answer-tokens", type=_range, help="scripted: long answers, LO:HI reasoning tokens per request (uniform)"
    )
    p.add_argument(
        "--answer-spread",
        choices=("uniform", "lognormal"),
        default="uniform",
        help="scripted: how --answer-tokens lengths spread (lognormal: median sqrt(LO*HI), a long tail)",
    )
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="pace of the scripted backend per token")
    p.add_argument(
        "--eos-rate",
        type=_rate,
        default=0.0,
        help="scripted: share of answers that end on the model's eos instead of the turn's end, where they "
        "differ (Kimi-K2.5: [EOS] instead of <|im_end|>)",
    )
    p.add_argument(
        "--canned",
        action="store_true",
        help="scripted, speed mode: plan one answer (from the first request) and give it to every request, "
        "cut by each request's max_new_tokens and stop rules; bodies are prepared bytes, so that a benchmark "
        "measures its client, not this engine",
    )


def _add_loop_options(p: argparse.ArgumentParser) -> None:
    """Repetition loops made on purpose (`backends.loops.LoopInjection`)."""
    g = p.add_argument_group(
        "loop injection",
        "A share of requests, drawn per row (the rid without its run nonce and attempt, else the prompt), "
        "degenerates into a repetition loop: from an onset on, the output repeats one n-gram until "
        "max_new_tokens. Requests not drawn never loop. The record's `loop` says which did.",
    )
    g.add_argument("--loop-share", type=_rate, default=0.0, help="share of requests that loop (default 0)")
    g.add_argument("--loop-onset", type=_range, default=(256, 1024), metavar="LO:HI",
                   help="output tokens before the loop starts, uniform (default 256:1024)")  # fmt: skip
    g.add_argument("--loop-period", type=_range, default=(1, 32), metavar="LO:HI",
                   help="tokens of the repeated n-gram, uniform, at least 1 (default 1:32)")  # fmt: skip
    g.add_argument("--loop-seed", type=int, default=0, help="seed of the draw (default 0)")


def _add_capacity_options(p: argparse.ArgumentParser) -> None:
    """The simulated GPU behind the scripted backend (`capacity`)."""
    g = p.add_argument_group(
        "capacity model (scripted backend)",
        "A simulated GPU scheduler (SGLang 0.5.23's admission, KV budget, retraction and prefix cache, see "
        "eagle3_datagen.engine.capacity), on when --max-running-requests and --max-total-tokens are both given. "
        "A step takes BASE + X*batch ms + Y*kv_tokens us + Z*prefill_tokens us, slept in real time.",
    )
    g.add_argument("--max-running-requests", type=int, metavar="R", help="requests decoded at once (SGLang's flag)")
    g.add_argument("--max-total-tokens", type=int, metavar="K", help="KV-cache pool in tokens (SGLang's flag)")
    g.add_argument("--step-ms", type=float, default=2.0, metavar="BASE", help="fixed time of a step (default 2.0)")
    g.add_argument("--step-ms-per-request", type=float, default=0.02, metavar="X",
                   help="step time per request in the batch, ms (default 0.02)")  # fmt: skip
    g.add_argument("--step-us-per-kv-token", type=float, default=0.0, metavar="Y",
                   help="step time per KV token the batch holds, us (default 0)")  # fmt: skip
    g.add_argument("--prefill-us-per-token", type=float, default=0.5, metavar="Z",
                   help="prefill time per computed prompt token, us (default 0.5)")  # fmt: skip
    g.add_argument(
        "--max-prefill-tokens", type=int, default=16384, help="prompt tokens per prefill batch (SGLang's flag)"
    )
    g.add_argument(
        "--schedule-conservativeness", type=float, default=1.0, help="scales new_token_ratio (SGLang's flag)"
    )
    g.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache (SGLang's flag)")
    g.add_argument(
        "--clip-max-new-tokens-estimation",
        type=int,
        default=4096,
        help="new tokens admission reserves per request at most (SGLang's env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)",
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The SGLang version and flags to act as, the test modes, logging."""
    p.add_argument(
        "--enable-metrics",
        action="store_true",
        help="as SGLang's flag: answers carry queue_time and the request's time stamps in meta_info",
    )
    p.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="as SGLang's flag: each streamed chunk carries only its new output_ids and text",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="as SGLang's flag: a streamed chunk every N tokens (the first at once), unless a request sets its own",
    )
    p.add_argument(
        "--sglang-version",
        default=None,
        help="the SGLang version to act as (default: the project's); before 0.5.23: 0.5.8's /get_load and /v1/loads",
    )
    p.add_argument("--fail-startup", action="store_true", help="tests: exit with code 3 during start-up")
    p.add_argument("--never-healthy", action="store_true", help="tests: /health never answers 200")
    p.add_argument("--die-after", type=int, help="tests: exit abruptly after serving this many requests")
    p.add_argument("--log-level", default="INFO")


def build_backend(args: argparse.Namespace):
    """The backend the options ask for: the model, or the scripted one (behind a simulated GPU when
    the capacity options are given)."""
    from eagle3_datagen.engine.backends.model import ModelBackend
    from eagle3_datagen.engine.backends.scripted import ScriptedBackend

    tokenizer_dir = args.tokenizer_dir or args.model_dir
    if args.backend == "model":
        return ModelBackend(
            args.model_dir,
            tokenizer_dir=tokenizer_dir,
            max_batch=args.max_batch,
            trust_remote_code=args.trust_remote_code,
            deterministic=args.enable_deterministic_inference,
        )
    return ScriptedBackend(
        tokenizer_dir,
        model_dir=args.model_dir,
        token_delay_s=args.token_delay_ms / 1000.0,
        eos_rate=args.eos_rate,
        max_batch=args.max_batch,
        trust_remote_code=args.trust_remote_code,
        deterministic=args.enable_deterministic_inference,
        answer_tokens=tuple(int(x) for x in args.answer_tokens) if args.answer_tokens else None,
        answer_spread=args.answer_spread,
        canned=args.canned,
        scheduler=_build_scheduler(args),
    )


def _build_scheduler(args: argparse.Namespace):
    """The simulated GPU of the capacity options, or None without them."""
    from eagle3_datagen.engine.capacity.scheduler import KVScheduler
    from eagle3_datagen.engine.capacity.step_model import StepModel

    if args.max_running_requests is None:
        return None
    return KVScheduler(
        args.max_running_requests,
        args.max_total_tokens,
        step_model=StepModel(
            base_ms=args.step_ms,
            per_request_ms=args.step_ms_per_request,
            per_kv_token_us=args.step_us_per_kv_token,
            prefill_per_token_us=args.prefill_us_per_token,
        ),
        context_length=args.context_length,
        max_prefill_tokens=args.max_prefill_tokens,
        schedule_conservativeness=args.schedule_conservativeness,
        prefix_cache=not args.disable_radix_cache,
        clip_max_new_tokens=args.clip_max_new_tokens_estimation,
    )


def build_app(args: argparse.Namespace):
    """The web app of the options, its backend not started yet."""
    from eagle3_datagen.engine.backends.loops import LoopInjection
    from eagle3_datagen.engine.server.app import create_app
    from eagle3_datagen.engine.server.faults import Faults
    from eagle3_datagen.engine.server.state import ENGINE_KEY
    from eagle3_datagen.settings import SGLANG_VERSION

    faults = Faults(
        latency_ms=args.latency_ms,
        error_rate=args.error_rate,
        reset_rate=args.reset_rate,
        hang_rate=args.hang_rate,
        fail_rids=args.fail_rids,
        seed=args.seed,
    )
    app = create_app(
        build_backend(args),
        context_length=args.context_length,
        model_path=str(args.model_dir),
        tokenizer_path=str(args.tokenizer_dir or args.model_dir),
        record_path=args.record or (args.record_dir / f"{os.getpid()}.jsonl" if args.record_dir else None),
        faults=faults,
        version=args.sglang_version or SGLANG_VERSION,
        enable_metrics=args.enable_metrics,
        incremental_streaming_output=args.incremental_streaming_output,
        stream_interval=args.stream_interval,
        loops=LoopInjection(
            share=args.loop_share,
            onset=tuple(int(x) for x in args.loop_onset),
            period=tuple(int(x) for x in args.loop_period),
            seed=args.loop_seed,
        ),
    )
    app[ENGINE_KEY].never_healthy = args.never_healthy
    app[ENGINE_KEY].die_after = args.die_after
    return app


async def serve(args: argparse.Namespace, parent: int) -> int:
    from aiohttp import web

    from eagle3_datagen.engine.server.state import ENGINE_KEY

    if args.fail_startup:
        log.error("failing start-up on purpose (--fail-startup)")
        return 3
    app = build_app(args)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    log.info("local engine (%s backend) listening on http://%s:%d", args.backend, args.host,
             args.port)  # fmt: skip
    rc = await _run_until_stopped(app[ENGINE_KEY], parent)
    await runner.cleanup()
    return rc


async def _run_until_stopped(srv, parent: int) -> int:
    """Wait for SIGTERM/SIGINT, the parent's death or a backend that failed to load; the exit code."""
    stop = asyncio.Event()
    reason: list[str] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: (reason.append(s.name), stop.set()))

    rc = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass
        if os.getppid() != parent:
            reason.append(f"parent {parent} is gone")
            stop.set()
        if srv.load_error is not None:
            reason.append(f"backend failed to load: {srv.load_error!r}")
            rc = 1
            stop.set()
    log.info("stopping: %s", ", ".join(reason))
    return rc


def main(argv: list[str] | None = None, prog: str = "python -m eagle3_datagen.engine") -> int:
    parent = os.getppid()  # first thing: the watch compares against the parent we started under
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.stream_interval < 1:
        parser.error("--stream-interval must be at least 1")
    if args.loop_period[0] < 1:
        parser.error("--loop-period must be at least 1")
    if args.canned and args.backend != "scripted":
        parser.error("--canned needs --backend scripted")
    if (args.max_running_requests is None) != (args.max_total_tokens is None):
        parser.error("the capacity model needs both --max-running-requests and --max-total-tokens")
    if args.max_running_requests is not None:
        if args.backend != "scripted":
            parser.error("the capacity model needs --backend scripted")
        if args.max_running_requests < 1 or args.max_total_tokens < 1:
            parser.error("--max-running-requests and --max-total-tokens must be positive")
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return asyncio.run(serve(args, parent))


if __name__ == "__main__":
    sys.exit(main())
