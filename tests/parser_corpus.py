"""Curated model outputs for the parser tests: the unit tests hold the expected results, the parity
test runs SGLang's own classes on the same inputs."""

B, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, CA, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def kimi_call(call_id: str, args: str) -> str:
    return f"{CB}{call_id}{CA}{args}{CE}"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
]

# One tool as a chat request declares it (a description and the required argument), for the tests
# that render a prompt with tools.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# (name, text) for the reasoning parsers; every case runs for every parser, version and forcing.
REASONING_TEXTS = [
    ("plain", "The user asks for 2+2.</think>The answer is 4."),
    ("leading_think", "<think>Let me think.</think>\n\nThe answer is 4."),
    ("double_leading_think", "<think><think>Twice.</think>Done."),
    ("truncated", "The user asks... let me keep thinking"),
    ("truncated_leading_think", "<think>\nStill thinking\n"),
    ("two_ends", "First.</think>Middle.</think>Last."),
    (
        "tool_after_reasoning",
        "Need a tool.</think>" + B + kimi_call("functions.get_weather:0", '{"city": "Paris"}') + E,
    ),
    ("tool_inside_reasoning", "Need a tool. " + B + kimi_call("functions.get_weather:0", '{"city": "Paris"}') + E),
    ("whitespace_around_tags", "  \n Thinking \n</think>\n\n  Answer  \n"),
    ("non_ascii", "Überlegung: 東京 ☃ </think>Réponse: 東京"),
    ("empty_reasoning", "</think>Just the answer."),
    ("only_end", "</think>"),
    ("think_in_middle", "Plan <think> inner </think> after"),
    ("no_tags", "Hello there."),
    ("empty", ""),
    (
        "qwen_tool_inside_reasoning",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    ),
    ("qwen_style_full", "<think>\nI should answer.\n</think>\n\nIt is 4."),
]

REASONING_PARSERS = ["kimi_k2", "qwen3", "qwen3-thinking", "deepseek-r1"]
FORCINGS = [None, True, False]

# (name, parser, text) for the tool-call detectors.
TOOL_TEXTS = [
    ("kimi_one", "kimi_k2", "Let me check." + B + kimi_call("functions.get_weather:0", '{"city": "Paris"}') + E),
    (
        "kimi_two_model_index",
        "kimi_k2",
        "Let me check."
        + B
        + kimi_call("functions.get_weather:3", '{"city": "Paris"}')
        + kimi_call("functions.search_web:4", '{"query": "news"}')
        + E,
    ),
    ("kimi_multiline_args", "kimi_k2", B + kimi_call("functions.get_weather:0", '{\n  "city": "Paris"\n}') + E),
    (
        "kimi_text_after_section",
        "kimi_k2",
        "Sure." + B + kimi_call("functions.get_weather:0", '{"city": "Lima"}') + E + "Trailing words.",
    ),
    ("kimi_truncated_call", "kimi_k2", "Calling." + B + CB + "functions.get_weather:0" + CA + '{"city": "Par'),
    (
        "kimi_whitespace_around",
        "kimi_k2",
        "Hi \n" + B + "\n" + CB + " functions.get_weather:0 " + CA + ' {"city": "Rome"} ' + CE + "\n" + E,
    ),
    ("kimi_no_section", "kimi_k2", "No tools needed here."),
    ("kimi_bare_name_id", "kimi_k2", B + kimi_call("get_weather:1", '{"city": "Kyiv"}') + E),
    ("kimi_bare_counter_id", "kimi_k2", B + kimi_call("2", '{"query": "rust"}') + E),
    ("kimi_dashed_name", "kimi_k2", B + kimi_call("functions.get-weather:0", '{"city": "Bern"}') + E),
    ("kimi_non_ascii_args", "kimi_k2", "Wetter?" + B + kimi_call("functions.get_weather:0", '{"city": "東京"}') + E),
    ("kimi_nested_braces", "kimi_k2", B + kimi_call("functions.search_web:0", '{"query": {"q": "x"}}') + E),
    ("kimi_empty_args", "kimi_k2", B + kimi_call("functions.get_weather:0", "{}") + E),
    ("kimi_bad_id", "kimi_k2", "x" + B + kimi_call("functions get weather", '{"city": "A"}') + E),
    (
        "qwen_one",
        "qwen25",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    (
        "qwen_two",
        "qwen25",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "search_web", "arguments": {"query": "é"}}\n</tool_call>',
    ),
    ("qwen_unknown_tool", "qwen25", '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'),
    ("qwen_bad_json", "qwen25", 'Text\n<tool_call>\n{"name": "get_weather", "arguments": {\n</tool_call>'),
    ("qwen_truncated", "qwen25", 'Text\n<tool_call>\n{"name": "get_weather"'),
    (
        "qwen_multiline_args",
        "qwen25",
        '<tool_call>\n{"name": "get_weather",\n "arguments": {\n  "city": "Paris"\n }}\n</tool_call>\nafter',
    ),
    (
        "qwen_parameters_key",
        "qwen25",
        '<tool_call>\n{"name": "search_web", "parameters": {"query": "q"}}\n</tool_call>',
    ),
    (
        "qwen_list",
        "qwen25",
        '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "search_web", "arguments": {"query": "B"}}]\n</tool_call>',
    ),
    ("qwen_not_object", "qwen25", '<tool_call>\n"just a string"\n</tool_call>'),
    ("qwen_no_call", "qwen25", "Plain answer."),
]

VERSIONS = ["0.5.8", "0.5.23"]
