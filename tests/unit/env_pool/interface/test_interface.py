"""Training interface pieces: schema annotations, hints, guidelines, the state value."""

from __future__ import annotations

import json

import pytest

from env_pool import tags as T
from env_pool.interface.feedback import parse_failure_hint, tool_error_hint, unknown_tool_hint
from env_pool.interface.guidelines import GuidelinePolicy, TagStat, evolve, guideline_block, select_guidelines
from env_pool.interface.schema_lite import annotate_tools
from env_pool.interface.state import RAW_INTERFACE, InterfaceState

DOC = {
    "name": "set_mode",
    "description": "Set a mode.",
    "parameters": {
        "type": "dict",
        "properties": {
            "mode": {"type": "string", "description": "The mode.", "enum": ["eco", "sport"]},
            "level": {"type": "integer", "description": "Level."},
        },
        "required": ["mode"],
    },
}


def test_observation_lite_annotates_a_copy():
    (out,) = annotate_tools([DOC], InterfaceState(schema_lite=True))
    assert out["parameters"]["properties"]["mode"]["description"] == "The mode. [required] Allowed values: eco, sport"
    assert out["parameters"]["properties"]["level"]["description"] == "Level."
    assert DOC["parameters"]["properties"]["mode"]["description"] == "The mode."  # original untouched


def test_observation_lite_keeps_the_description_as_given():
    doc = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "required": ["x"],
            "properties": {
                "x": {"type": "string", "description": "An x. \n"},
                "y": {"type": "string", "enum": ["a", "b"]},
            },
        },
    }
    (out,) = annotate_tools([doc], InterfaceState(schema_lite=True))
    assert out["parameters"]["properties"]["x"]["description"] == "An x. \n [required]"
    assert out["parameters"]["properties"]["y"]["description"] == "Allowed values: a, b"


def test_observation_lite_options():
    (out,) = annotate_tools([DOC], InterfaceState(schema_lite=True, schema_show_types=True, schema_drop_optional=True))
    assert list(out["parameters"]["properties"]) == ["mode"]
    assert "[type: string]" in out["parameters"]["properties"]["mode"]["description"]
    assert annotate_tools([DOC], RAW_INTERFACE) == [DOC]


@pytest.mark.parametrize(
    "error, fragment",
    [
        ("set_mode() missing 1 required positional argument: 'mode'", "required argument is missing"),
        ("set_mode() got an unexpected keyword argument 'speed'", "parameter names listed"),
        ("cat: 'x.txt': No such file or directory", "does not exist where you are"),
        ("cd: temp: No such directory. You cannot use path to change directory.", "does not exist where you are"),
        ("cd: ..: No such directory", "does not exist where you are"),
        ("cd: a/b: Unsupported path. Only one folder level at a time is supported.", "one directory level"),
        ("No user is currently logged in.", "authentication"),
        ("Token expired", "authentication"),
        ("argument 'level' expected integer, got str", "wrong type"),
        ("Both inputs must be numbers", "wrong type"),
        ("Booking not found", "the tool reported an error"),
    ],
)
def test_tool_error_hints_by_pattern(error, fragment):
    assert fragment in tool_error_hint(error)


def test_long_unrecognised_errors_get_no_hint():
    assert tool_error_hint("x" * 500) is None


def test_parse_hint_lists_twelve_tools_then_a_count():
    names = [f"t{i}" for i in range(15)]
    hint = parse_failure_hint("json", "bad JSON", names)
    assert "t11" in hint and "t12" not in hint and "(and 3 more)" in hint and "<tool_call>" in hint
    assert "plain text" in hint
    assert "(and 2 more)" in unknown_tool_hint("zz", [f"t{i}" for i in range(10)])


def stat(count, reward_mean):
    return TagStat(count, count * reward_mean)


def test_guidelines_need_frequency_prevalence_and_low_reward():
    profile = {
        T.PASS: stat(60, 1.0),
        T.STATE_MISMATCH: stat(20, 0.0),  # pressure 0.2
        T.EMPTY_TURN: stat(12, 0.25),  # pressure 0.12 * 0.75 = 0.09
        T.SPURIOUS_TOOL_CALL: stat(7, 0.0),  # count < 8
        T.RESPONSE_MISMATCH: stat(10, 0.6),  # reward_mean not < 0.6
        T.CHECKER_ERROR: stat(500, 0.0),  # excluded, and not in N
    }
    assert select_guidelines(profile) == ("state_aware", "active_respond")
    # N counts failure tags only: 9 of 100 is under 0.10 however few passes there are.
    failures = {T.STATE_MISMATCH: stat(9, 0.0), T.RESPONSE_MISMATCH: stat(91, 0.0)}
    assert select_guidelines(failures) == ("format",)


def test_prevalence_leaves_out_passed_abstained_and_unknown_turns():
    # The released denominator: 8 state mismatches among 8 failures is
    # prevalence 1.0, not 8 / 1008 (counting passes would need 100+ of them).
    profile = {
        T.PASS: stat(600, 1.0),
        T.CORRECT_ABSTENTION: stat(300, 1.0),
        T.UNKNOWN: stat(100, 0.5),
        T.STATE_MISMATCH: stat(8, 0.0),
    }
    assert select_guidelines(profile) == ("state_aware",)


def test_top_three_by_pressure():
    profile = {
        t: stat(10 + i, 0.0)
        for i, t in enumerate(
            [T.SPURIOUS_TOOL_CALL, T.EMPTY_TURN, T.STATE_MISMATCH, T.INSTANCE_MISMATCH, T.RESPONSE_MISMATCH]
        )
    }
    assert select_guidelines(profile) == ("format", "scope", "state_aware")
    assert select_guidelines(profile, GuidelinePolicy(top_k=1)) == ("format",)
    assert select_guidelines(profile, GuidelinePolicy(top_k=0)) == ()  # 0 means none
    assert select_guidelines(profile, GuidelinePolicy(min_count=14)) == ("format",)  # counts 10..14


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("min_count", -1, "min_count"),
        ("top_k", 1.5, "top_k"),
        ("min_prevalence", 1.1, "min_prevalence"),
        ("max_reward_mean", -0.1, "max_reward_mean"),
    ],
)
def test_guideline_policy_rejects_bad_thresholds(field, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        GuidelinePolicy(**{field: value})


def test_evolve_bumps_the_version_only_on_change():
    state = InterfaceState(guidelines=True)
    profile = {T.STATE_MISMATCH: stat(20, 0.0)}
    s1 = evolve(state, profile)
    assert s1.version == 1 and s1.active_guidelines == ("state_aware",)
    assert evolve(s1, profile) is s1
    assert evolve(RAW_INTERFACE, profile) is RAW_INTERFACE  # guidelines off: nothing evolves
    s2 = evolve(s1, profile, category_profiles={"base": {T.EMPTY_TURN: stat(10, 0.0)}})
    assert (
        s2.version == 2
        and s2.guidelines_for("base") == ("active_respond",)
        and s2.guidelines_for("miss_func") == ("state_aware",)
    )


def test_state_round_trips_through_json():
    state = InterfaceState(
        version=3,
        schema_lite=True,
        guidelines=True,
        active_guidelines=("format",),
        category_guidelines={"base": ("scope",)},
    )
    assert InterfaceState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    with pytest.raises(ValueError, match="unknown interface fields"):
        InterfaceState.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="unknown guideline kind"):
        InterfaceState(active_guidelines=("be_smart",))
    with pytest.raises(ValueError, match="unknown interface component"):
        RAW_INTERFACE.with_components("lite,magic")


def test_raw_means_nothing_added():
    assert RAW_INTERFACE.is_raw
    assert InterfaceState(version=7, guidelines=True).is_raw  # on, but nothing active
    assert not InterfaceState(schema_lite=True).is_raw
    assert guideline_block(()) == ""
    assert guideline_block(("format",)).startswith("Guidelines:\n- ")


def test_worked_exchanges_use_placeholders_and_the_active_format():
    from env_pool.interface.examples import exchange_messages, placeholder_exchange

    tools = [
        {"name": "needs_path", "parameters": {"properties": {"p": {"type": "weird"}}, "required": ["p"]}},
        {
            "name": "move",
            "parameters": {
                "properties": {
                    "mode": {"type": "string", "enum": ["slow", "fast"]},
                    "n": {"type": "integer"},
                    "note": {"type": "string"},
                },
                "required": ["mode", "n"],
            },
        },
    ]
    request, call, result, reply = placeholder_exchange(tools)
    # The first tool whose required parameters all have a placeholder; optional ones left out.
    assert call.name == "move" and call.arguments == {"mode": "slow", "n": 1} and "move" in request
    assert placeholder_exchange(tools[:1]) is None
    msgs = exchange_messages([(request, call, result, reply)], "python")
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1]["content"] == "[move(mode='slow', n=1)]" and msgs[2]["name"] == "move"
    assert '"name": "move"' in exchange_messages([(request, call, result, reply)], "json")[1]["content"]
    from env_pool.interface.state import InterfaceState

    assert (
        not InterfaceState(worked_examples=True).is_raw and InterfaceState().with_components("examples").worked_examples
    )
