"""The environment contract (env_pool/contract.py): the example environment keeps it, and each way a
user's environment can break it is refused with one line naming the environment and the method."""

from __future__ import annotations

import pytest

from env_pool.base import EpisodeStateError, play_scripted
from env_pool.contract import EnvContractError, check_env_class, check_episode, check_verdict
from env_pool.registry import ENVIRONMENTS, category_of, env_kind, environments
from env_pool.toy.env import ToyToolEnv
from examples.thermostat.env import ThermostatEnv
from tests.unit.env_pool.broken_envs import (
    ClashingPrefix,
    ForgotEnd,
    NotAnEnvironment,
    StepsAfterDone,
    TagOutsideVocabulary,
)


def check_class(cls) -> None:
    check_env_class(cls, environments(), ENVIRONMENTS)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_the_example_and_the_built_in_envs_keep_the_contract():
    for cls in (ThermostatEnv, ToyToolEnv):
        check_class(cls)
    env = ThermostatEnv()
    for task_id in ("thermo_0", "thermo_1"):
        check_episode(env, task_id, category_of(task_id))
    check_episode(ToyToolEnv(), "toy_0", "add")


def test_the_registry_finds_an_outside_env_by_its_type():
    assert env_kind("thermo_7") == "thermostat" and category_of("thermo_7") == "adjust"
    assert env_kind("toy_3") == "toy"  # a clashing prefix never shadows a built-in env
    with pytest.raises(KeyError, match="thermo_"):
        env_kind("nobody_1")


def test_a_missing_method_is_named_before_the_env_is_built():
    with pytest.raises(EnvContractError) as exc:
        check_class(ForgotEnd)
    assert (
        one_line(exc)
        == "env tests.unit.env_pool.broken_envs.ForgotEnd does not implement end (docs/custom-environment.md)"
    )


def test_a_class_that_is_no_environment_is_refused():
    with pytest.raises(EnvContractError, match="NotAnEnvironment.* is not an env_pool.base.Environment"):
        check_class(NotAnEnvironment)


def test_a_task_prefix_that_overlaps_another_envs_is_refused():
    with pytest.raises(EnvContractError) as exc:
        check_class(ClashingPrefix)
    assert "ClashingPrefix: task_prefix 'toy' overlaps env toy's 'toy_'" in one_line(exc)


def test_a_tag_outside_the_vocabulary_is_refused_before_a_run_and_during_one():
    env = TagOutsideVocabulary()
    with pytest.raises(EnvContractError) as exc:
        check_episode(env, "thermo_1", "adjust")
    assert one_line(exc).startswith(
        "env tests.unit.env_pool.broken_envs.TagOutsideVocabulary.judge: tag 'wrong_room' is not in the vocabulary"
    )
    with pytest.raises(EnvContractError, match="TagOutsideVocabulary.judge: tag 'wrong_room'"):
        play_scripted(env, "thermo_1", [["I cannot help."]] * 2)  # every episode's result() checks its verdict


def test_a_step_after_done_is_refused():
    with pytest.raises(EnvContractError) as exc:
        check_episode(StepsAfterDone(), "thermo_0", "set")
    assert one_line(exc) == (
        "env tests.unit.env_pool.broken_envs.StepsAfterDone.step: took a step after the episode was done; "
        "raise EpisodeStateError (docs/custom-environment.md)"
    )
    env = ThermostatEnv()
    play_scripted(env, "thermo_0", env.reference_turns("thermo_0"))
    with pytest.raises(EpisodeStateError, match=r"ThermostatEnv.step: thermo_0 ended \(completed\); call reset"):
        env.step("again")


def test_a_verdict_needs_a_reward_in_0_1_and_one_tag_and_label_per_turn():
    env = ThermostatEnv()
    for reward in (0, 1, 0.0, 0.5, 1.0):  # partial credit is a reward like any other
        check_verdict(env, reward, ["pass", "correct_abstention"], ["pass", "pass"])
    for reward in (1.5, -0.1, float("nan"), float("inf"), "1", None):
        with pytest.raises(EnvContractError) as exc:
            check_verdict(env, reward, ["pass"], ["pass"])  # type: ignore[arg-type]
        assert one_line(exc) == (
            f"env examples.thermostat.env.ThermostatEnv.judge: reward {reward!r} is not a number in [0, 1] "
            "(docs/custom-environment.md)"
        )
    with pytest.raises(EnvContractError, match="2 tags and 1 labels"):
        check_verdict(env, 0, ["pass", "pass"], ["pass"])
    with pytest.raises(EnvContractError, match="label 'so_so' is not in the vocabulary"):
        check_verdict(env, 0, ["pass"], ["so_so"])


def test_a_reference_the_verifier_fails_is_refused():
    class NeverPasses(ThermostatEnv):
        def judge(self):
            import dataclasses

            return dataclasses.replace(super().judge(), reward=0)

    with pytest.raises(EnvContractError, match="NeverPasses.reference_turns: a correct agent's steps for thermo_0"):
        check_episode(NeverPasses(), "thermo_0", "set")


def test_partial_credit_under_the_success_threshold_fails_the_reference_and_a_bad_threshold_the_class():
    class HalfCredit(ThermostatEnv):
        def judge(self):
            import dataclasses

            return dataclasses.replace(super().judge(), reward=0.5)

    with pytest.raises(EnvContractError) as exc:
        check_episode(HalfCredit(), "thermo_0", "set")
    assert "earn reward 0.5 from judge, under its success_threshold 1.0" in one_line(exc)

    class Lenient(HalfCredit):
        success_threshold = 0.5  # half credit counts as solved

    check_episode(Lenient(), "thermo_0", "set")

    class Impossible(ThermostatEnv):
        success_threshold = 1.5

    with pytest.raises(EnvContractError, match=r"Impossible: success_threshold 1.5 is not in \(0, 1\]"):
        check_class(Impossible)
