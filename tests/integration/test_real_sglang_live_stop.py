"""The live loop stop against the real SGLang 0.5.23 server on CPU (the real-SGLang tier).

The server runs the demo model with `--incremental-streaming-output`, as launched servers do when
`quality.live_stop` is on. With greedy sampling and a budget of 512 tokens, a few of the demo
model's answers to config/prompts/code.jsonl never reach <|im_end|> and fall into a loop; the rest
stop within a few dozen tokens. The same requests go through the project's `GenerateClient` twice:
not streamed (every answer to its end) and streamed with the live stop. Greedy decoding makes the
first run the reference for the second: a row stopped live holds exactly a prefix of its answer,
ending in a loop, and every row not stopped is the same answer with the same finish. The aborted
requests leave nothing running or waiting on the server.
"""

import json
import urllib.request

import pytest
from workdir import ROOT

from eagle3_datagen.generation.client import GenerateClient, run_loop
from eagle3_datagen.generation.load import parse_loads
from eagle3_datagen.generation.requests import Request, RequestTemplate
from eagle3_datagen.generation.server_info import streams_incrementally
from eagle3_datagen.generation.streaming import LiveStop
from eagle3_datagen.quality.flags import LOOP_FINISH
from eagle3_datagen.quality.loops import LoopSettings, find_loop
from eagle3_datagen.settings import ClientSettings
from polling import wait_until
from real_sglang import real_server

pytestmark = [pytest.mark.slow, pytest.mark.real_sglang]

BUDGET = 512
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
LOOPS = LoopSettings(min_tokens=32)  # the live stop waits for twice that: 64 tokens of one n-gram
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}


def single_turn_prompts(tokenizer) -> list[Request]:
    """The code category's one-question conversations (a system message allowed), as the demo
    model's chat template writes them with thinking on."""
    out = []
    for line in (ROOT / "config" / "prompts" / "code.jsonl").read_text().splitlines():
        row = json.loads(line)
        messages = row.get("messages") or [
            {"role": ROLES[m["from"]], "content": m["value"]} for m in row.get("conversations", [])
        ]
        if [m["role"] for m in messages if m["role"] != "system"] != ["user"]:
            continue
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, thinking=True, tokenize=True, return_dict=False
        )
        out.append(Request(id=row["id"], sample_index=0, prompt_ids=list(ids), max_new_tokens=BUDGET, seed=0))
    return out


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_loops_are_stopped_live_on_the_real_server_and_nothing_else_changes(tmp_path, demo_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    requests = single_turn_prompts(tokenizer)
    assert len(requests) >= 20, len(requests)
    template = RequestTemplate(GREEDY, [tokenizer.convert_tokens_to_ids("<|im_end|>")], len(tokenizer))
    # A loaded 2-core box decodes the looping answers at a few tokens a second: no request may time
    # out (a timed-out request is sent again from its start, and never ends under load).
    settings = ClientSettings.from_config(concurrency=8, request_timeout_floor_s=3600)
    log = tmp_path / "real_sglang.log"
    with real_server(demo_model_dir, log, extra=["--incremental-streaming-output"]) as url:
        assert streams_incrementally(get_json(f"{url}/server_info"))
        whole = run_loop(GenerateClient([url], template, settings).run(requests))
        live = LiveStop(loop=LOOPS, stream_interval=8)
        streamed = run_loop(GenerateClient([url], template, settings, live=live).run(requests))
        # Every abort reached the scheduler: nothing of the stopped requests runs on or waits.
        wait_until(
            lambda: (load := parse_loads(get_json(f"{url}/v1/loads"))).running == 0 and load.waiting == 0,
            f"the server to run and hold no request after the live run (log: {log})",
            timeout_s=120,
            interval_s=0.2,
        )

    assert whole.keys() == streamed.keys() == {r.key for r in requests}
    failed = {k: r["error"] for run in (whole, streamed) for k, r in run.items() if r["status"] != "ok"}
    assert not failed, failed
    stopped = {k: r for k, r in streamed.items() if r["finish_type"] == LOOP_FINISH}
    print(
        f"{len(stopped)} of {len(requests)} stopped live: "
        + ", ".join(f"{k[0]} at {len(r['output_ids'])} of {len(whole[k]['output_ids'])}" for k, r in stopped.items())
    )
    assert stopped, {k[0]: (r["finish_type"], len(r["output_ids"])) for k, r in whole.items()}
    assert len(stopped) < len(requests), "no loop-free answer was left to compare"
    for key, row in stopped.items():
        ids, twin = list(row["output_ids"]), list(whole[key]["output_ids"])
        assert ids == twin[: len(ids)], f"{key[0]}: the stopped ids are not a prefix of the greedy answer"
        assert len(ids) < len(twin), f"{key[0]}: stopped at {len(ids)} tokens, its whole answer has {len(twin)}"
        assert row["completion_tokens"] == len(ids), key[0]
        assert find_loop(ids, LOOPS) is not None, f"{key[0]}: stopped without ending in a loop"
    for key, row in streamed.items():
        if key not in stopped:
            assert list(row["output_ids"]) == list(whole[key]["output_ids"]), f"{key[0]}: the streamed answer differs"
            assert row["finish_type"] == whole[key]["finish_type"], key[0]
