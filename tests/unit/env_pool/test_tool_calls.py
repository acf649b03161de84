"""The strict parser: literal values only, never code, text kept byte for byte."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_pool.tool_calls import (
    FORMATS,
    ParsedStep,
    ToolCall,
    parse_python_calls,
    parse_step,
    render_calls,
)

# Tool and parameter names are identifiers (never Python keywords) in every schema.
names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**18), 10**18),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
calls = st.lists(st.builds(ToolCall, names, st.dictionaries(keys, values, max_size=4)), min_size=1, max_size=3)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=300, deadline=None)
@given(calls=calls)
def test_render_then_parse_round_trips_exactly(fmt, calls):
    parsed = parse_step(render_calls(calls, fmt), fmt)
    assert parsed.error is None
    assert list(parsed.calls) == calls
    # Equality would let 1 == 1.0 == True pass: compare types too.
    for got, want in zip(parsed.calls, calls):
        assert repr(got.arguments) == repr(want.arguments)


@settings(max_examples=200, deadline=None)
@given(calls=calls)
def test_bare_python_calls_round_trip_and_only_a_single_call_goes_bare(calls):
    text = render_calls(calls, "python", bare=True)
    assert text.startswith("[") == (len(calls) > 1)
    assert list(parse_step(text, "python").calls) == calls
    assert render_calls(calls, "json", bare=True) == render_calls(calls, "json")  # json has no brackets to drop


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=500, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_raises(fmt, text):
    assert isinstance(parse_step(text, fmt), ParsedStep)


_FRAGMENTS = [
    "[",
    "]",
    "(",
    ")",
    "=",
    ",",
    "'",
    '"',
    "{",
    "}",
    ":",
    "<tool_call>",
    "</tool_call>",
    "__import__('os')",
    ".system",
    "open",
    "exec",
    "eval",
    "lambda",
    "f",
    "x=1",
    " ",
    "\n",
    "*",
    "**",
    "-",
    "1e9",
    "<|python_tag|>",
    '{"name": "f", "parameters": ',
    ";",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n",
    "```json\n",
    "```",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=500, deadline=None)
@given(parts=st.lists(st.sampled_from(_FRAGMENTS), max_size=30))
def test_call_shaped_noise_never_raises(fmt, parts):
    assert isinstance(parse_step("".join(parts), fmt), ParsedStep)


def test_string_arguments_keep_text_byte_for_byte():
    content = "a(b) </tool_call> \\x28 'q' \"dq\" \u00e9\U0001f600 \x00 ls(x) \\n"
    for fmt in FORMATS:
        (call,) = parse_step(render_calls([ToolCall("echo", {"content": content})], fmt), fmt).calls
        assert call.arguments["content"] == content


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[f(1)]", "positional"),
        ("[f(**{'a': 1})]", "**kwargs"),
        ("[f(a=1, a=2)]", "repeats"),
        ("[f(a=x)]", "only literal"),
        ("[f(a=g())]", "only literal"),
        ("[f(a=1+2)]", "only literal"),
        ("[os.system(a='x')]", "plain tool name"),
        ("[f(a=b'x')]", "bytes"),
        ("[f(a=1j)]", "complex"),
        ("[f(a=float('nan'))]", "only literal"),
        ("[f(a=-'x')]", "sign"),
        ("[f(a={**d})]", "**"),
        ("[f(a=[x for x in y])]", "only literal"),
        ("[f(a=", "not a python call list"),
    ],
)
def test_python_rejects_non_literals_with_a_precise_message(text, fragment):
    parsed = parse_step(text, "python")
    assert parsed.error is not None and fragment in parsed.error


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', "NaN"),
        ('<tool_call>{"name": "f", "arguments": {"a": 1, "a": 2}}</tool_call>', "duplicate key"),
        ('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "f"} trailing</tool_call>', "expected </tool_call>"),
        ('<tool_call>{"name": "f"}', "expected </tool_call>"),
        ("<tool_call>[1]</tool_call>", "JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "'name'"),
        ('<tool_call>{"name": "f", "extra": 1}</tool_call>', "unexpected keys"),
        ("</tool_call>", "without an opening"),
    ],
)
def test_json_rejects_malformed_calls_with_a_precise_message(text, fragment):
    parsed = parse_step(text, "json")
    assert parsed.error is not None and fragment in parsed.error


def test_plain_text_is_a_message_not_an_error():
    assert parse_step("The file was moved.", "json") == ParsedStep()
    assert parse_step("The file was moved.", "python") == ParsedStep()


def test_python_accepts_bfcl_forms():
    assert parse_python_calls("```python\n[cd(folder='a'), ls(a=True)]\n```") == [
        ToolCall("cd", {"folder": "a"}),
        ToolCall("ls", {"a": True}),
    ]
    assert parse_python_calls("cd(folder='a')") == [ToolCall("cd", {"folder": "a"})]
    assert parse_python_calls("[f(x=-1.5, y=(1, 2), z={'k': [None]})]") == [
        ToolCall("f", {"x": -1.5, "y": (1, 2), "z": {"k": [None]}})
    ]


ZIP = {"get_zipcode_based_on_city": ("city",), "estimate_distance": ("cityA", "cityB")}


def test_python_binds_positional_literals_by_the_given_signature():
    # multi_turn_miss_func_85's ground truth is written this way.
    assert parse_step("[get_zipcode_based_on_city('San Francisco')]", "python", ZIP).calls == (
        ToolCall("get_zipcode_based_on_city", {"city": "San Francisco"}),
    )
    assert parse_python_calls("[estimate_distance('83214', cityB='94016')]", ZIP) == [
        ToolCall("estimate_distance", {"cityA": "83214", "cityB": "94016"})
    ]
    # Keyword form and positional form render the same call.
    assert (
        render_calls(parse_python_calls("estimate_distance('a', 'b')", ZIP), "python")
        == "[estimate_distance(cityA='a', cityB='b')]"
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[estimate_distance('a', 'b', 'c')]", "takes at most 2 positional argument(s) (cityA, cityB), 3 given"),
        ("[estimate_distance(cityA='a', 'b')]", "positional argument follows keyword argument"),
        ("[estimate_distance('a', cityA='b')]", "'cityA' both by position and by name"),
        ("[get_weather('Oslo')]", "not a known tool"),
        ("[estimate_distance(*['a', 'b'])]", "*args"),
        ("[get_zipcode_based_on_city(city_name)]", "only literal"),
        ("[get_zipcode_based_on_city(open('x'))]", "only literal"),
    ],
)
def test_python_positional_errors_are_precise(text, fragment):
    parsed = parse_step(text, "python", ZIP)
    assert parsed.error is not None and fragment in parsed.error, parsed.error


def test_json_reads_several_calls_among_prose():
    text = 'Sure.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "a"}}\n</tool_call>\n<tool_call>{"name": "ls"}</tool_call> ok'
    assert parse_step(text, "json").calls == (ToolCall("cd", {"folder": "a"}), ToolCall("ls", {}))


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tool-call format"):
        parse_step("x", "xml")


def test_oversized_step_is_rejected_without_parsing():
    assert "limit" in parse_step("[f(a='" + "x" * 300_000 + "')]", "python").error
