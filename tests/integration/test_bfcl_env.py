"""The episode API on real BFCL tasks: turn structure, limits, outcomes, safety."""

from __future__ import annotations

import copy
import gc
import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_pool import tags as T
from env_pool.base import EpisodeStateError, Outcome, play_scripted
from env_pool.bfcl.env import BfclEnv
from env_pool.bfcl.runtime import InstanceSet
from env_pool.bfcl.tasks import get_task, split_ids
from env_pool.interface.state import InterfaceState
from env_pool.tool_calls import ToolCall, render_calls

CD = render_calls([ToolCall("cd", {"folder": "document"})], "json")


def test_messages_follow_the_turn_structure():
    env = BfclEnv()
    msgs = env.reset("multi_turn_base_0")
    assert [m["role"] for m in msgs] == ["system", "user"]
    r = env.step(render_calls([ToolCall("ls", {})], "json"))
    assert not r.turn_ended and r.num_calls == 1 and r.messages[0]["role"] == "tool"
    r = env.step("All listed.")
    assert r.turn_ended and not r.done and [m["role"] for m in r.messages] == ["user"]
    assert env.messages[-1] == r.messages[-1]


def test_step_limit_force_quits_like_bfcl():
    env = BfclEnv(step_limit=20)
    env.reset("multi_turn_base_0")
    results = [env.step(render_calls([ToolCall("pwd", {})], "json")) for _ in range(21)]
    assert [r.done for r in results] == [False] * 20 + [True]
    assert results[-1].outcome == Outcome.STEP_LIMIT
    res = env.result()
    assert res.error_type == T.ERR_FORCE_TERMINATED and res.reward == 0 and res.outcome == "step_limit"
    assert env.stats.outcomes["step_limit"] == 1


def test_context_overflow_is_a_named_counted_outcome():
    count = lambda messages: sum(len(m["content"]) for m in messages) // 4
    env = BfclEnv(max_context_tokens=count(BfclEnv().reset("multi_turn_long_context_0")) + 50, token_counter=count)
    env.reset("multi_turn_long_context_0")
    result = None
    for _ in range(5):
        result = env.step(render_calls([ToolCall("ls", {"a": True})], "json"))
        if result.done:
            break
    assert result.done and result.outcome == Outcome.CONTEXT_OVERFLOW
    assert env.result().outcome == "context_overflow" and env.stats.outcomes == {"context_overflow": 1}


def test_prompt_that_cannot_fit_ends_at_reset():
    env = BfclEnv(max_context_tokens=100, token_counter=lambda m: 10_000)
    env.reset("multi_turn_base_0")
    assert env.done and env.result().outcome == "context_overflow"


def test_api_misuse_is_a_clear_error():
    env = BfclEnv()
    with pytest.raises(EpisodeStateError, match="reset"):
        env.step("hi")
    with pytest.raises(ValueError, match="tool_format"):
        BfclEnv(tool_format="xml")
    with pytest.raises(ValueError, match="go together"):
        BfclEnv(max_context_tokens=10)
    env.reset("multi_turn_base_0")
    with pytest.raises(EpisodeStateError, match="done"):
        env.result()


def test_parse_failure_ends_the_turn_raw_but_gets_a_hint_in_training():
    raw = BfclEnv()
    raw.reset("multi_turn_base_0")
    assert raw.step("<tool_call>{not json}</tool_call>").turn_ended
    train = BfclEnv()
    train.reset("multi_turn_base_0", InterfaceState(error_feedback=True))
    r = train.step("<tool_call>{not json}</tool_call>")
    assert not r.turn_ended and "could not be read as a tool call" in r.messages[0]["content"]
    assert "Available tools:" in r.messages[0]["content"]


def test_unknown_tools_are_never_executed():
    env = BfclEnv(tool_format="python")
    env.reset("multi_turn_base_0", InterfaceState(error_feedback=True))
    r = env.step("[open(file='/etc/passwd'), exec(source='1')]")
    assert [m["content"].splitlines()[0] for m in r.messages] == [
        "Error during execution: name 'open' is not defined",
        "Error during execution: name 'exec' is not defined",
    ]
    assert "not an available tool" in r.messages[0]["content"]


PAYLOADS = [
    "__import__('os').system('touch {p}')",
    "open('{p}', 'w').write('x')",
    "exec(\"open('{p}','w')\")",
    "eval(\"__import__('pathlib').Path('{p}').touch()\")",
    "(lambda: open('{p}','w'))()",
]


@settings(max_examples=60, deadline=None)
@given(
    payload=st.sampled_from(PAYLOADS),
    wrap=st.sampled_from(
        [
            "[{x}]",
            "{x}",
            "[ls(a={x})]",
            "[echo(content='', file_name={x})]",
            '<tool_call>{{"name": "ls", "arguments": {{"a": {x}}}}}</tool_call>',
        ]
    ),
)
def test_code_in_model_output_never_runs(tmp_path_factory, payload, wrap):
    marker = tmp_path_factory.mktemp("pwn") / "created"
    text = wrap.format(x=payload.format(p=marker))
    for fmt in ("json", "python"):
        env = BfclEnv(tool_format=fmt)
        play_scripted(env, "multi_turn_base_0", [[text]] * 4)
    assert not marker.exists()


@pytest.mark.parametrize(
    "task_id", ["multi_turn_long_context_150", "multi_turn_long_context_50"]
)  # TravelAPI, VehicleControlAPI
def test_long_context_state_does_not_leak_between_episodes(task_id):
    task = get_task(task_id)
    a = InstanceSet(task.initial_config, list(task.involved_classes), True)
    pristine = {n: copy.deepcopy(vars(i)) for n, i in a.instances.items()}

    def vandalise(value):  # empty every nested container, innermost first
        if isinstance(value, dict):
            for v in value.values():
                vandalise(v)
            value.clear()
        elif isinstance(value, list):
            for v in value:
                vandalise(v)
            value.clear()

    for inst in a.instances.values():
        for key, value in vars(inst).items():
            if not key.startswith("_"):
                vandalise(value)
    b = InstanceSet(task.initial_config, list(task.involved_classes), True)
    for name, inst in b.instances.items():
        assert {k: v for k, v in vars(inst).items() if not k.startswith("_")} == {
            k: v for k, v in pristine[name].items() if not k.startswith("_")
        }


def test_long_context_episodes_are_order_independent():
    ids = [i for i in split_ids("all") if "long_context" in i][::4]  # every API class
    env = BfclEnv()

    def transcripts(order):
        out = {}
        for task_id in order:
            play_scripted(env, task_id, env.reference_turns(task_id))
            out[task_id] = copy.deepcopy(env.messages)
        return out

    forward = transcripts(ids)
    backward = transcripts(list(reversed(ids)))
    assert forward == backward


def test_memory_stays_flat_over_many_episodes():
    env = BfclEnv()
    rng = random.Random(0)
    ids = split_ids("all")
    plan = [rng.choice(ids) for _ in range(1400)]
    for task_id in plan[:400]:  # warm caches (tasks, methods, parsed ground truth)
        play_scripted(env, task_id, env.reference_turns(task_id))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for task_id in plan[400:]:
        play_scripted(env, task_id, env.reference_turns(task_id))
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # The last episode's transcript is still held; growth beyond that is a leak.
    assert grown < 3_000_000, f"{grown} bytes retained after 1000 episodes"


def test_worked_exchange_is_training_only_and_not_the_ground_truth():
    env = BfclEnv(tool_format="python")
    task_id = "multi_turn_base_0"
    raw = env.reset(task_id)
    trained = env.reset(task_id, InterfaceState(worked_examples=True))
    # The same conversation with one placeholder exchange before the first user turn.
    assert len(trained) == len(raw) + 4 and trained[0] == raw[0] and trained[5:] == raw[1:]
    assert [m["role"] for m in trained[1:5]] == ["user", "assistant", "tool", "assistant"]
    shown = trained[2]["content"]
    truth = [c for turn in env.reference_turns(task_id) for c in turn]
    assert shown not in truth and "example" in trained[1]["content"].lower()
    result = play_scripted(env, task_id, env.reference_turns(task_id), InterfaceState(worked_examples=True))
    assert result.reward == 1  # the exchange is never executed: the task's state is untouched
