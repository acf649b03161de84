"""The built-in environments and the thermostat play exactly as they did before float rewards, the
reward-only verdict and the helpers every env shares (issue 48): every prompt, every tool message
(hints included) and every verdict of three agents (the reference, one that never calls a tool, one
that garbles a call and calls an unknown tool first) on tasks of each category, raw and under the
full training interface, digested. The digests were taken from the code before those changes; a
binary env whose prompt or verdict moves by a byte fails here."""

from __future__ import annotations

import hashlib
import json

import pytest

from env_pool.base import Environment, Outcome
from env_pool.bfcl.env import BfclEnv
from env_pool.interface.state import RAW_INTERFACE, InterfaceState
from env_pool.shopping.env import ShoppingEnv
from env_pool.toy.env import ToyToolEnv
from examples.thermostat.env import ThermostatEnv

TRAINING = InterfaceState(
    version=3,
    schema_lite=True,
    error_feedback=True,
    guidelines=True,
    worked_examples=True,
    active_guidelines=("active_respond", "state_aware"),
)
ENVS = {
    "shopping": (ShoppingEnv, ["shop_0", "shop_1", "shop_2", "shop_250", "shop_251", "shop_479"]),
    "toy": (ToyToolEnv, ["toy_0", "toy_1", "toy_2", "toy_299"]),
    "thermostat": (ThermostatEnv, ["thermo_0", "thermo_1", "thermo_299"]),
    "bfcl": (BfclEnv, ["multi_turn_base_0", "multi_turn_miss_func_3", "multi_turn_miss_param_5"]),
}
UNCHANGED = {
    ("shopping", "python", False): "2e6af26eff2ae2b32dbedc9e1d3d0ba638a829b97cc32daebd421473ecec88a6",
    ("shopping", "python", True): "d3cc51a3bc2b385470f7a4a71e6f4a5942bad139f34a89dfe4da2afe84a98002",
    ("shopping", "json", False): "4f396dd68524e242dbd98ad55924a326296ad5ff658c0c40a7994f5d2ef34a86",
    ("shopping", "json", True): "0f4d8273212aa985488ccca328c6a1a8c2a860b338368d522656d40163d4c581",
    ("toy", "python", False): "5553a5743249666fc571d9e151fb3e2ab517daaf7bf745e6614797e95b1950a3",
    ("toy", "python", True): "dca3ca3c7583f509a8fbb6e351e71c6bf750c9ce171aa15535e3a49045bad58d",
    ("toy", "json", False): "5240ff949817bedab3f64001d81d6516d4a6fbdd7f2ef8bd9db4c4df7ee2b59d",
    ("toy", "json", True): "54e8a490c551153b8259981ea8fe09446db4aa113d76f780f702e930f1086cce",
    ("thermostat", "python", False): "6fcfbbad05caef6f4171ec79f05da8454e695f3f34bfc7993740ff4cbbdc1d26",
    ("thermostat", "python", True): "3476d9c49a4ce36a35122649ec4afa7e271d17b82e2906f293c4da1471962e3e",
    ("thermostat", "json", False): "86f2d19e1b743557179f5ea697a7061fc790a765f2de00c6a3b7bff89dc8ea06",
    ("thermostat", "json", True): "49add85ec95c67cc452118e6c5acfe4b85668cbf1171008a42901c450c6bf6d5",
    ("bfcl", "python", False): "6f88c30f4f2cc36e38b84d6bf97086518ffe8ec76e1dbcddf241c36843175ce2",
    ("bfcl", "python", True): "42ccc53c2dfaf827e99b7de06e012ff1dabda0394308adf42bf17c4d0d20434d",
    ("bfcl", "json", False): "97a758fa26fa1dceabcfc9881b92bc85359f8b2fd32bb99806e0576056994e0f",
    ("bfcl", "json", True): "31d159c70c300cfc6434b89230ef5435aae5595c01ae1634ed427ada791da987",
}
VOLATILE = ("env_seconds", "judge_seconds")


def _play(env: Environment, task_id: str, turns: list[list[str]], interface: InterfaceState) -> dict:
    """Every message the episode showed and its verdict (timings left out)."""
    shown = list(env.reset(task_id, interface))
    for turn in turns:
        for text in turn:
            if env.done:
                break
            step = env.step(text)
            shown.append([step.turn_index, step.turn_ended, step.done, step.num_calls, step.parse_error])
            shown += step.messages
            if step.turn_ended or step.done:
                break
    if not env.done:
        env.end(Outcome.ABORTED)
    result = {k: v for k, v in env.result().to_dict().items() if k not in VOLATILE}
    return {"shown": shown, "result": result}


def _agents(env: Environment, task_id: str, fmt: str) -> dict[str, list[list[str]]]:
    reference = env.reference_turns(task_id)
    garbled = "[oops(" if fmt == "python" else "<tool_call>{oops</tool_call>"
    unknown = (
        "[no_such_tool(x=1)]" if fmt == "python" else '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'
    )
    return {
        "reference": reference,
        "silent": [["I cannot help with that."]] * len(reference),
        "clumsy": [[garbled, unknown, *turn] for turn in reference],
    }


def digest(name: str, fmt: str, training: bool) -> str:
    cls, ids = ENVS[name]
    env = cls(tool_format=fmt)
    interface = TRAINING if training else RAW_INTERFACE
    plays = {t: {a: _play(env, t, turns, interface) for a, turns in _agents(env, t, fmt).items()} for t in ids}
    return hashlib.sha256(json.dumps(plays, sort_keys=True, default=str).encode()).hexdigest()


@pytest.mark.parametrize("key", sorted(UNCHANGED), ids=lambda k: "-".join(map(str, k)))
def test_a_binary_env_plays_as_before(key):
    assert digest(*key) == UNCHANGED[key]
