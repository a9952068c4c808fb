"""`python -m eagle3_datagen.engine --model-dir DIR --port N ...` (-h): the local engine, serving
SGLang's native HTTP API on CPU, logging to stderr. Stops on SIGTERM/SIGINT, and by itself
when its parent process dies (polled every second), so that no engine outlives the job that started
it. Imports `settings` and every module of the engine (lazily, so that `-h` answers at once).
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
    lo_f, hi_f = float(lo), float(hi or lo)
    if hi_f < lo_f or lo_f < 0:
        raise argparse.ArgumentTypeError(f"expected LO:HI with 0 <= LO <= HI, got {text!r}")
    return lo_f, hi_f


def _counts(text: str) -> tuple[int, int]:
    return tuple(int(x) for x in _range(text))


def _rate(text: str) -> float:
    if not 0.0 <= float(text) <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return float(text)


def build_parser(prog: str = "python -m eagle3_datagen.engine") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="A CPU stand-in for an SGLang server (native /generate API).")  # fmt: skip
    add = p.add_argument
    add("--model-dir", type=Path, required=True, help="model (or tokenizer) directory")
    add("--tokenizer-dir", type=Path, help="tokenizer directory (default: --model-dir)")
    add("--backend", choices=("model", "scripted"), default="model")
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--context-length", type=int, required=True)
    add("--trust-remote-code", action="store_true", help="load a tokenizer that ships its own code")
    add("--enable-deterministic-inference", action="store_true", help="honour each request's sampling_seed")
    add("--enable-metrics", action="store_true", help="answers carry queue_time in meta_info")
    add("--incremental-streaming-output", action="store_true", help="a streamed chunk carries only its new output")
    add("--stream-interval", type=int, default=1, help="a streamed chunk every N tokens (the first at once)")
    add("--record", type=Path, help="append one JSON line per served request here")
    add("--record-dir", type=Path, help="like --record, to DIR/<pid>.jsonl (one file per engine)")
    add("--log-level", default="INFO")
    g = p.add_argument_group("faults (tests)").add_argument
    g("--latency-ms", type=_range, help="added latency LO:HI in ms, uniform")
    g("--error-rate", type=_rate, default=0.0, help="probability of HTTP 500/503")
    g("--reset-rate", type=_rate, default=0.0, help="probability of a reset connection")
    g("--hang-rate", type=_rate, default=0.0, help="probability of never answering")
    g("--seed", type=int, default=0, help="seed of the fault RNG")
    g("--cut-rate", type=_rate, default=0.0, help="probability of a stream dropped mid-answer")
    g("--cut-after", type=_counts, default=(1, 1024), metavar="LO:HI", help="streamed ids before the drop")
    g("--fail-startup", action="store_true", help="exit with code 3 during start-up")
    g("--never-healthy", action="store_true", help="/health never answers 200")
    g("--die-after", type=int, help="exit abruptly after serving this many requests")
    g = p.add_argument_group("backends").add_argument
    g("--max-batch", type=int, default=16, help="rows decoded together (model; scripted without a capacity model)")
    g("--answer-tokens", type=_counts, help="scripted: long answers, LO:HI reasoning tokens per request")
    g("--answer-spread", choices=("uniform", "lognormal"), default="uniform", help="scripted: their spread")
    g("--eos-rate", type=_rate, default=0.0, help="scripted: share of answers ending on eos, not the turn's end")
    g = p.add_argument_group("loop injection", "A share of requests, drawn per row, repeats one n-gram from an onset on until max_new_tokens; the record's `loop` says which.").add_argument  # fmt: skip
    g("--loop-share", type=_rate, default=0.0, help="share of requests that loop (default 0)")
    g("--loop-onset", type=_counts, default=(256, 1024), metavar="LO:HI", help="output tokens before the loop starts")
    g("--loop-period", type=_counts, default=(1, 32), metavar="LO:HI", help="tokens of the repeated n-gram, at least 1")
    g("--loop-seed", type=int, default=0, help="seed of the draw")
    g = p.add_argument_group("capacity model (scripted)", "A simulated GPU (eagle3_datagen.engine.capacity), on with both limits; a step takes BASE + X*batch ms + Y*kv_tokens us + 0.5 us per prefill token, slept.").add_argument  # fmt: skip
    g("--max-running-requests", type=int, metavar="R", help="requests decoded at once")
    g("--max-total-tokens", type=int, metavar="K", help="KV-cache pool in tokens")
    g("--step-ms", type=float, default=2.0, metavar="BASE", help="fixed time of a step (default 2.0)")
    g("--step-ms-per-request", type=float, default=0.02, metavar="X", help="per request in the batch (default 0.02)")
    g("--step-us-per-kv-token", type=float, default=0.0, metavar="Y", help="per KV token held (default 0)")
    g("--clip-max-new-tokens-estimation", type=int, default=4096, help="new tokens admission reserves at most")
    return p


def build_app(args: argparse.Namespace):
    """The web app of the options, its backend not started yet."""
    from eagle3_datagen.engine.app import create_app
    from eagle3_datagen.engine.capacity import KVScheduler, StepModel
    from eagle3_datagen.engine.loops import LoopInjection
    from eagle3_datagen.engine.server import ENGINE_KEY, Faults

    tokenizer_dir = args.tokenizer_dir or args.model_dir
    common = dict(max_batch=args.max_batch, trust_remote_code=args.trust_remote_code,
                  deterministic=args.enable_deterministic_inference)  # fmt: skip
    if args.backend == "model":
        from eagle3_datagen.engine.model import ModelBackend

        backend = ModelBackend(args.model_dir, tokenizer_dir=tokenizer_dir, **common)
    else:
        from eagle3_datagen.engine.scripted import ScriptedBackend

        scheduler = None
        if args.max_running_requests is not None:
            step = StepModel(args.step_ms, args.step_ms_per_request, args.step_us_per_kv_token)
            scheduler = KVScheduler(args.max_running_requests, args.max_total_tokens, step_model=step,
                                    context_length=args.context_length,
                                    clip_max_new_tokens=args.clip_max_new_tokens_estimation)  # fmt: skip
        backend = ScriptedBackend(tokenizer_dir, model_dir=args.model_dir, eos_rate=args.eos_rate, scheduler=scheduler,
                                  answer_tokens=args.answer_tokens, answer_spread=args.answer_spread, **common)  # fmt: skip
    faults = Faults(latency_ms=args.latency_ms, error_rate=args.error_rate, reset_rate=args.reset_rate,
                    hang_rate=args.hang_rate, seed=args.seed, cut_rate=args.cut_rate, cut_after=args.cut_after)  # fmt: skip
    loops = LoopInjection(share=args.loop_share, onset=args.loop_onset, period=args.loop_period, seed=args.loop_seed)
    record = args.record or (args.record_dir / f"{os.getpid()}.jsonl" if args.record_dir else None)
    app = create_app(backend, context_length=args.context_length, model_path=str(args.model_dir),
                     tokenizer_path=str(tokenizer_dir), record_path=record, faults=faults, loops=loops,
                     enable_metrics=args.enable_metrics, stream_interval=args.stream_interval,
                     incremental_streaming_output=args.incremental_streaming_output)  # fmt: skip
    app[ENGINE_KEY].never_healthy = args.never_healthy
    app[ENGINE_KEY].die_after = args.die_after
    return app


async def serve(args: argparse.Namespace, parent: int) -> int:
    from aiohttp import web

    from eagle3_datagen.engine.server import ENGINE_KEY

    if args.fail_startup:
        log.error("failing start-up on purpose (--fail-startup)")
        return 3
    app = build_app(args)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    log.info("local engine (%s backend) listening on http://%s:%d", args.backend, args.host, args.port)
    srv = app[ENGINE_KEY]
    stop, reason, rc = asyncio.Event(), [], 0
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: (reason.append(s.name), stop.set()))
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
    await runner.cleanup()
    return rc


def main(argv: list[str] | None = None, prog: str = "python -m eagle3_datagen.engine") -> int:
    parent = os.getppid()  # first thing: the watch compares against the parent we started under
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    capacity = (args.max_running_requests, args.max_total_tokens)
    if args.stream_interval < 1 or args.loop_period[0] < 1:
        parser.error("--stream-interval and --loop-period must be at least 1")
    if capacity != (None, None) and (None in capacity or args.backend != "scripted" or min(capacity) < 1):
        parser.error(
            "the capacity model needs --backend scripted and both --max-running-requests and --max-total-tokens, positive"
        )
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    return asyncio.run(serve(args, parent))


if __name__ == "__main__":
    sys.exit(main())
