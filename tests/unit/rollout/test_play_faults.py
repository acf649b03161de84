"""Episodes the system ends (rollout/play.py) still end with a record, marked with their infra fault's
kind and first error, and the rest of the group plays on: a generation request that fails or is
refused, an env whose own code raises, an episode past its wall-clock deadline. The generator is
scripted at the edge (tests/unit/rollout/test_play.py); env and chat template are real."""

from __future__ import annotations

import time

import pytest

from env_pool.toy.env import ToyToolEnv
from rollout.chat import ChatTokenizer
from rollout.generator import SamplingConfig
from rollout.play import run_group
from tests.unit.rollout.test_play import ScriptedGenerator, toy_reference

SAMPLING = SamplingConfig(max_new_tokens=64)


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    from weights.model_assets import load_tokenizer

    return ChatTokenizer(load_tokenizer("tiny"))


class FailingGenerator(ScriptedGenerator):
    """Raises ``errors[rollout index]`` on that rollout's first request."""

    def __init__(self, chat, script, errors: dict[int, Exception], delay_s: float = 0.0):
        super().__init__(chat, script)
        self.errors, self.delay_s = errors, delay_s

    def generate(self, requests, sampling):
        time.sleep(self.delay_s)
        for r in requests:
            index, step = (int(x) for x in r.request_id.rsplit("-", 2)[1:])
            if step == 0 and index in self.errors:
                raise self.errors[index]
        return super().generate(requests, sampling)


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_failed_or_refused_request_ends_only_its_episode_as_an_infra_fault(chat, lockstep):
    script = {i: [toy_reference("toy_4")] for i in range(3)}
    errors = {0: RuntimeError("engine died on this request"), 1: ValueError("prompt longer than the model")}
    generator = FailingGenerator(chat, script, errors if not lockstep else {0: errors[0]})
    trajs = run_group(ToyToolEnv, generator, chat, "toy_4", 3, SAMPLING, group_id="g", lockstep=lockstep)
    assert [t.rollout_index for t in trajs] == [0, 1, 2]
    if lockstep:  # one batch per step: the failed call ends every episode in it
        assert {t.infra_fault.kind for t in trajs} == {"generation_error"}
        return
    assert trajs[0].infra_fault.kind == "generation_error" and "engine died" in trajs[0].infra_fault.message
    assert trajs[0].error == "generation_error: RuntimeError: engine died on this request"
    assert trajs[1].infra_fault.kind == "engine_rejected" and trajs[1].num_generated_tokens == 0
    assert trajs[2].infra_fault is None and trajs[2].reward == 1.0
    for t in trajs[:2]:
        t.validate()
        assert t.outcome == "aborted"


class BrokenToyEnv(ToyToolEnv):
    """The env's own code raises (not a tool's error reply to the model)."""

    def step(self, assistant_text: str):
        raise KeyError("the tool server's session table lost this episode")


def test_an_exception_from_the_envs_own_code_is_an_infra_fault_not_a_crash_of_the_group(chat):
    generator = ScriptedGenerator(chat, {0: [toy_reference("toy_4")], 1: ["I do not know."]})
    trajs = run_group(BrokenToyEnv, generator, chat, "toy_4", 2, SAMPLING, group_id="g", lockstep=False)
    assert [t.infra_fault.kind for t in trajs] == ["env_error", "env_error"]
    assert "session table" in trajs[0].infra_fault.message and trajs[0].task_id == "toy_4"
    assert all(t.num_generated_tokens > 0 for t in trajs)  # the turn the env broke on was generated: counted


def test_an_episode_past_its_deadline_ends_as_an_infra_fault(chat):
    generator = FailingGenerator(chat, {0: ["I do not know."]}, {}, delay_s=1.0)
    (traj,) = run_group(ToyToolEnv, generator, chat, "toy_4", 1, SAMPLING, group_id="g", deadline_s=0.2)
    # the call still waiting was left behind: nothing of it reached the episode
    assert traj.infra_fault.kind == "deadline" and traj.num_generated_tokens == 0
    with pytest.raises(ValueError, match="deadline must be > 0"):
        run_group(ToyToolEnv, generator, chat, "toy_4", 1, SAMPLING, deadline_s=0)
