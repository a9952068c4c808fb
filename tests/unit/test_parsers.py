"""Expected results of the SGLang parser re-implementations on a curated corpus, for 0.5.8 and 0.5.23.

The same inputs run through SGLang's own classes in tests/integration/test_sglang_parity.py.
"""

import pytest

import parser_corpus as corpus
from eagle3_datagen.tokens import parsers

T = dict(corpus.REASONING_TEXTS)
TOOL = {name: text for name, _, text in corpus.TOOL_TEXTS}
SECTION = corpus.B + corpus.kimi_call("functions.get_weather:0", '{"city": "Paris"}') + corpus.E
OLD, NEW = "0.5.8", "0.5.23"

# (case, parser, force_reasoning, {version: (reasoning, normal)}); one value for both versions when equal.
REASONING_CASES = [
    ("plain", "kimi_k2", True, ("The user asks for 2+2.", "The answer is 4.")),
    ("plain", "kimi_k2", None, {OLD: ("The user asks for 2+2.", "The answer is 4."), NEW: ("", T["plain"])}),
    ("plain", "qwen3", None, ("", T["plain"])),
    ("plain", "qwen3-thinking", None, ("The user asks for 2+2.", "The answer is 4.")),
    ("plain", "deepseek-r1", False, ("The user asks for 2+2.", "The answer is 4.")),
    (
        "leading_think",
        "kimi_k2",
        True,
        {OLD: ("Let me think.", "The answer is 4."), NEW: ("Let me think.", "\n\nThe answer is 4.")},
    ),
    (
        "leading_think",
        "qwen3",
        None,
        {OLD: ("Let me think.", "The answer is 4."), NEW: ("Let me think.", "\n\nThe answer is 4.")},
    ),
    ("double_leading_think", "qwen3", None, ("Twice.", "Done.")),
    ("truncated", "kimi_k2", True, (T["truncated"], "")),
    ("truncated", "kimi_k2", False, {OLD: (T["truncated"], ""), NEW: ("", T["truncated"])}),
    ("truncated_leading_think", "qwen3", None, {OLD: ("Still thinking", ""), NEW: ("\nStill thinking\n", "")}),
    ("two_ends", "kimi_k2", True, ("First.", "Middle.</think>Last.")),
    ("two_ends", "deepseek-r1", None, ("First.", "Middle.</think>Last.")),
    ("tool_after_reasoning", "kimi_k2", True, ("Need a tool.", SECTION)),
    ("tool_inside_reasoning", "kimi_k2", True, {OLD: ("Need a tool. " + SECTION, ""), NEW: ("Need a tool. ", SECTION)}),
    ("tool_inside_reasoning", "qwen3", True, ("Need a tool. " + SECTION, "")),
    (
        "whitespace_around_tags",
        "kimi_k2",
        True,
        {OLD: ("Thinking \n", "Answer"), NEW: ("  \n Thinking \n", "\n\n  Answer  \n")},
    ),
    ("non_ascii", "kimi_k2", True, ("Überlegung: 東京 ☃ ", "Réponse: 東京")),
    ("empty_reasoning", "kimi_k2", True, ("", "Just the answer.")),
    ("only_end", "qwen3-thinking", None, ("", "")),
    ("think_in_middle", "kimi_k2", None, {OLD: ("Plan  inner ", "after"), NEW: ("Plan <think> inner ", " after")}),
    ("no_tags", "qwen3", False, ("", "Hello there.")),
    ("empty", "kimi_k2", True, ("", "")),
    (
        "qwen_tool_inside_reasoning",
        "qwen3",
        True,
        {
            OLD: (T["qwen_tool_inside_reasoning"], ""),
            NEW: ("Checking.\n", T["qwen_tool_inside_reasoning"][len("Checking.\n") :]),
        },
    ),
    (
        "qwen_style_full",
        "qwen3",
        None,
        {OLD: ("I should answer.\n", "It is 4."), NEW: ("\nI should answer.\n", "\n\nIt is 4.")},
    ),
]


@pytest.mark.parametrize("version", [OLD, NEW])
@pytest.mark.parametrize(
    "case,parser,force,expected", REASONING_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in REASONING_CASES]
)
def test_reasoning(case, parser, force, expected, version):
    want = expected[version] if isinstance(expected, dict) else expected
    assert parsers.parse_reasoning(T[case], parser=parser, version=version, force_reasoning=force) == want


def test_reasoning_version_ranges():
    text = "  r </think>  a  "
    assert parsers.parse_reasoning(text, parser="kimi_k2", version="0.5.12", force_reasoning=True) == ("r ", "a")
    assert parsers.parse_reasoning(text, parser="kimi_k2", version="0.5.15", force_reasoning=True) == ("  r ", "  a  ")
    # 0.5.10/0.5.12 strip the reasoning before a tool-section cut; 0.5.13+ keep it as generated.
    cut = " r " + SECTION
    assert parsers.parse_reasoning(cut, parser="kimi_k2", version="0.5.10", force_reasoning=True) == ("r", SECTION)
    assert parsers.parse_reasoning(cut, parser="kimi_k2", version="0.5.13", force_reasoning=True) == (" r ", SECTION)
    # qwen3 learns the <tool_call> interruption in 0.5.14.
    q = "r\n<tool_call>\n{}"
    assert parsers.parse_reasoning(q, parser="qwen3", version="0.5.13", force_reasoning=True) == (q, "")
    assert parsers.parse_reasoning(q, parser="qwen3", version="0.5.14", force_reasoning=True) == (
        "r\n",
        "<tool_call>\n{}",
    )


@pytest.mark.parametrize("bad", ["0.5.9", "0.4.10", "0.5.24", "0.6.0", "latest"])
def test_unknown_versions_are_refused(bad):
    with pytest.raises(parsers.UnsupportedVersion):
        parsers.parse_reasoning("x", parser="qwen3", version=bad)


def test_version_parsing():
    assert parsers.parse_version("0.5.8.post1") == (0, 5, 8)
    assert parsers.parse_version((0, 5, 23)) == (0, 5, 23)
    with pytest.raises(ValueError):
        parsers.parse_reasoning("x", parser="nope", version="0.5.23")


def test_chat_force_reasoning():
    f = parsers.chat_force_reasoning
    assert f("kimi_k2", NEW, {}) and f("kimi_k2", NEW, {"thinking": True})
    assert not f("kimi_k2", NEW, {"thinking": False})
    assert f("kimi_k2", OLD, {"thinking": False})  # 0.5.8: DeepSeekR1-style, forced regardless
    assert f("qwen3", NEW, {}) and not f("qwen3", NEW, {"enable_thinking": False})
    assert not f("qwen3", OLD, {"enable_thinking": 1})  # 0.5.8 wants exactly True
    assert f("qwen3", NEW, {"enable_thinking": False}, chat_template="<|im_start|>assistant\\n<think>\\n")


GW, SW = "get_weather", "search_web"
# (case, {version: (normal, [(tool_index, name, arguments)])}) for the detectors.
TOOL_CASES = [
    ("kimi_one", ("Let me check.", [(0, GW, '{"city": "Paris"}')])),
    (
        "kimi_two_model_index",
        {
            OLD: ("Let me check.", [(3, GW, '{"city": "Paris"}'), (4, SW, '{"query": "news"}')]),
            NEW: ("Let me check.", [(0, GW, '{"city": "Paris"}'), (1, SW, '{"query": "news"}')]),
        },
    ),
    ("kimi_multiline_args", {OLD: ("", []), NEW: ("", [(0, GW, '{\n  "city": "Paris"\n}')])}),
    ("kimi_text_after_section", ("Sure.", [(0, GW, '{"city": "Lima"}')])),
    ("kimi_truncated_call", ("Calling.", [])),
    ("kimi_whitespace_around", ("Hi \n", [(0, GW, '{"city": "Rome"}')])),
    ("kimi_no_section", ("No tools needed here.", [])),
    ("kimi_bare_name_id", {OLD: ("", [(1, GW, '{"city": "Kyiv"}')]), NEW: ("", [(0, GW, '{"city": "Kyiv"}')])}),
    ("kimi_bare_counter_id", {OLD: ("", []), NEW: ("", [(0, SW, '{"query": "rust"}')])}),
    ("kimi_dashed_name", {OLD: ("", []), NEW: ("", [(0, "get-weather", '{"city": "Bern"}')])}),
    ("kimi_non_ascii_args", ("Wetter?", [(0, GW, '{"city": "東京"}')])),
    ("kimi_nested_braces", ("", [(0, SW, '{"query": {"q": "x"}}')])),
    ("kimi_empty_args", ("", [(0, GW, "{}")])),
    ("kimi_bad_id", ("x", [])),
    ("qwen_one", ("Let me look.", [(0, GW, '{"city": "Paris"}')])),
    ("qwen_two", ("", [(0, GW, '{"city": "Oslo"}'), (1, SW, '{"query": "é"}')])),
    ("qwen_unknown_tool", ("", [])),
    ("qwen_bad_json", ("Text", [])),
    ("qwen_truncated", ("Text", [])),
    ("qwen_multiline_args", ("", [(0, GW, '{"city": "Paris"}')])),
    ("qwen_parameters_key", ("", [(1, SW, '{"query": "q"}')])),
    ("qwen_list", ("", [(0, GW, '{"city": "A"}'), (1, SW, '{"query": "B"}')])),
    ("qwen_no_call", ("Plain answer.", [])),
]
PARSER_OF = {name: parser for name, parser, _ in corpus.TOOL_TEXTS}


@pytest.mark.parametrize("version", [OLD, NEW])
@pytest.mark.parametrize("case,expected", TOOL_CASES, ids=[c[0] for c in TOOL_CASES])
def test_tool_detector(case, expected, version):
    want = expected[version] if isinstance(expected, dict) else expected
    normal, calls = parsers.detect_and_parse(TOOL[case], corpus.TOOLS, parser=PARSER_OF[case], version=version)
    assert (normal, [(c.tool_index, c.name, c.arguments) for c in calls]) == want


def test_qwen_non_object_raises_and_chat_layer_keeps_text():
    text = TOOL["qwen_not_object"]
    with pytest.raises(parsers.ToolParseError):
        parsers.detect_and_parse(text, corpus.TOOLS, parser="qwen25", version=NEW)
    assert parsers.parse_tool_calls(text, corpus.TOOLS, parser="qwen25", version=NEW) == (text, [])


def test_chat_layer_wrapper_versions():
    # No call parsed: up to 0.5.15 the full text stays content, from 0.5.16 the section is dropped.
    text = TOOL["kimi_truncated_call"]
    assert parsers.parse_tool_calls(text, corpus.TOOLS, parser="kimi_k2", version=OLD) == (text, [])
    assert parsers.parse_tool_calls(text, corpus.TOOLS, parser="kimi_k2", version=NEW) == ("Calling.", [])
    # No tools declared: the parser does not run.
    assert parsers.parse_tool_calls(TOOL["kimi_one"], None, parser="kimi_k2", version=NEW) == (TOOL["kimi_one"], [])


def test_tool_call_ids():
    call = parsers.ToolCall(1, GW, "{}")
    assert parsers.tool_call_id(call, parser="kimi_k2", history_count=2, position=1) == "functions.get_weather:3"
