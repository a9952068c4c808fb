"""What the benches of streamed answers against the scripted engine share (live_stop.py, resume.py):
the two cores (the engine on one, this process, the client, pinned to the other), one-turn requests
of one budget on the real Qwen3 tokenizer with their template, and the engine's simulated-GPU flags.
Not a benchmark."""

import os
import sys
from pathlib import Path

from _harness import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from eagle3_datagen.generation.requests import Request, RequestTemplate  # noqa: E402

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


def add_options(p, *, requests: int) -> None:
    p.add_argument("--requests", type=int, default=requests)
    p.add_argument("--budget", type=int, default=32768, help="max_new_tokens of every request")
    p.add_argument("--step-ms", type=float, default=0.2, help="simulated GPU step (one token per running request)")
    p.add_argument("--stream-interval", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--cores", help="two cores: engine,client (default: the first two allowed)")


def setup(args, words: str, first: int = 0) -> tuple[int, Path, list[Request], RequestTemplate]:
    """(the engine's core, the tokenizer's folder, the requests, their template); this process is
    pinned to the client's core, and the engines it starts import the package from this tree."""
    from transformers import AutoTokenizer

    from eagle3_datagen.demo.tokenizers import qwen3_tokenizer_dir

    allowed = sorted(os.sched_getaffinity(0))
    cores = [int(c) for c in args.cores.split(",")] if args.cores else (allowed * 2)[:2]
    os.sched_setaffinity(0, {cores[1]})
    tok_dir = qwen3_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    reqs = []
    for i in range(args.requests):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": words.format(i=i + first)}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        reqs.append(Request(id=f"q{i}", sample_index=0, prompt_ids=list(ids), max_new_tokens=args.budget, seed=i))
    template = RequestTemplate(
        sampling=SAMPLING,
        stop_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")],
        vocab_size=len(tokenizer),
    )
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(ROOT / "scripts") + (os.pathsep + env_path if env_path else "")
    return cores[0], tok_dir, reqs, template


def engine_command(args, tok_dir: Path, port: int, record: Path, core: int, answers: str) -> list[str]:
    """The scripted engine on `core`, streaming as SGLang does, recording every answer, behind a
    simulated GPU with room for every request at once; a bench adds its own flags."""
    return [
        *["taskset", "-c", str(core), sys.executable, "-m", "eagle3_datagen.engine", "--backend", "scripted"],
        *["--model-dir", str(tok_dir), "--port", str(port), "--context-length", str(args.budget + 8192)],
        *["--answer-tokens", answers, "--incremental-streaming-output", "--record", str(record)],
        *["--max-running-requests", str(max(args.concurrency, args.requests))],
        *["--max-total-tokens", str((args.budget + 1024) * args.requests * 2)],
        *["--step-ms", str(args.step_ms), "--step-ms-per-request", "0", "--log-level", "WARNING"],
    ]
