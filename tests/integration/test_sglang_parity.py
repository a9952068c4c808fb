"""Parity of `eagle3_datagen.tokens.parsers` with SGLang's own parser classes, per SGLang version.

Each version is installed before the suite runs (`make test` runs `tests/sglang_oracles.py`, which
pip-installs it `--no-deps`, plus the few pure-Python packages its parser modules import, into
`<repo>/.cache/sglang/<version>`) and imported here in its own subprocess with an empty `sglang`
package module, so `sglang/__init__.py` (which pulls torch from 0.5.12 on) never runs and the two
versions never share an interpreter. A version that is not installed fails the test, naming the
command that installs it.
"""

import json
import subprocess
import sys

import pytest

import parser_corpus as corpus
from eagle3_datagen.tokens import parsers
from sglang_oracles import installed

pytestmark = pytest.mark.slow

ORACLE = r"""
import importlib, json, sys, types
target = sys.argv[1]
sys.path.insert(0, target)
pkg = types.ModuleType("sglang")
pkg.__path__ = [target + "/sglang"]
sys.modules["sglang"] = pkg
import logging
logging.disable(logging.CRITICAL)
rp = importlib.import_module("sglang.srt.parser.reasoning_parser")
kimi = importlib.import_module("sglang.srt.function_call.kimik2_detector")
qwen = importlib.import_module("sglang.srt.function_call.qwen25_detector")
protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
job = json.load(sys.stdin)
out = {"reasoning": [], "tools": [], "wrapper": [], "torch_loaded": None}
for parser, force, text in job["reasoning"]:
    try:
        r, n = rp.ReasoningParser(parser, stream_reasoning=False, force_reasoning=force).parse_non_stream(text)
        out["reasoning"].append([r or "", n or ""])
    except Exception as e:
        out["reasoning"].append({"error": type(e).__name__})
tools = [protocol.Tool(**t) for t in job["tools_schema"]]
detectors = {"kimi_k2": kimi.KimiK2Detector, "qwen25": qwen.Qwen25Detector}
for parser, text in job["tools"]:
    try:
        res = detectors[parser]().detect_and_parse(text, tools)
        out["tools"].append([res.normal_text, [[c.tool_index, c.name, c.parameters] for c in res.calls]])
    except Exception as e:
        out["tools"].append({"error": type(e).__name__})
try:  # FunctionCallParser pulls torch through xgrammar in later versions
    fcp = importlib.import_module("sglang.srt.function_call.function_call_parser")
except Exception:
    fcp = None
for parser, text in job["tools"]:
    if fcp is None:
        out["wrapper"].append(None)
        continue
    p = fcp.FunctionCallParser(tools, parser)
    try:
        if not p.has_tool_call(text):
            out["wrapper"].append([text, []])
            continue
        normal, calls = p.parse_non_stream(text)
        out["wrapper"].append([normal, [[c.tool_index, c.name, c.parameters] for c in calls]])
    except Exception as e:
        out["wrapper"].append([text, []])
out["torch_loaded"] = "torch" in sys.modules
json.dump(out, sys.stdout)
"""


def _job():
    reasoning = [
        (parser, force, text)
        for _, text in corpus.REASONING_TEXTS
        for parser in corpus.REASONING_PARSERS
        for force in corpus.FORCINGS
    ]
    return {"reasoning": reasoning, "tools": [(p, t) for _, p, t in corpus.TOOL_TEXTS], "tools_schema": corpus.TOOLS}


@pytest.mark.parametrize("version", corpus.VERSIONS)
def test_parsers_match_sglang(version):
    target = installed(version)
    job = _job()
    done = subprocess.run(
        [sys.executable, "-c", ORACLE, str(target)], input=json.dumps(job), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sg = json.loads(done.stdout)
    assert sg["torch_loaded"] is False

    mismatches = []
    for (parser, force, text), theirs in zip(job["reasoning"], sg["reasoning"]):
        ours = list(parsers.parse_reasoning(text, parser=parser, version=version, force_reasoning=force))
        if ours != theirs:
            mismatches.append(("reasoning", parser, force, text, ours, theirs))
    for (parser, text), theirs, wrapped in zip(job["tools"], sg["tools"], sg["wrapper"]):
        try:
            normal, calls = parsers.detect_and_parse(text, corpus.TOOLS, parser=parser, version=version)
            ours = [normal, [[c.tool_index, c.name, c.arguments] for c in calls]]
        except parsers.ToolParseError:
            ours = {"error": "AttributeError"}
        if ours != theirs:
            mismatches.append(("detector", parser, text, ours, theirs))
        if wrapped is not None:
            normal, calls = parsers.parse_tool_calls(text, corpus.TOOLS, parser=parser, version=version)
            mine = [normal, [[c.tool_index, c.name, c.arguments] for c in calls]]
            if mine != wrapped:
                mismatches.append(("wrapper", parser, text, mine, wrapped))
    assert not mismatches, "\n".join(repr(m) for m in mismatches)
    assert len(job["reasoning"]) + len(job["tools"]) >= 30
