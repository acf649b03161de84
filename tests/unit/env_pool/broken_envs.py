"""Environments that break the contract the way a user's might, each in one way (the example
environment otherwise). Importable by ``_target_`` (tests.unit.env_pool.broken_envs.X) so `seal
train`'s preflight can be pointed at them."""

from __future__ import annotations

import dataclasses

from env_pool.base import Environment, EpisodeResult, Message, Outcome, StepResult
from env_pool.interface.state import InterfaceState
from examples.thermostat.env import ThermostatEnv


class ForgotEnd(Environment):
    """Written against the base class directly, without ``end``."""

    kind = "forgot_end"
    task_prefix = "forgot_"

    @classmethod
    def category_of(cls, task_id: str) -> str:
        return "base"

    def task_ids(self, split: str = "all") -> list[str]:
        return ["forgot_0"]

    def reset(self, task_id: str, interface: InterfaceState | None = None) -> list[Message]:
        return []

    def step(self, assistant_text: str) -> StepResult:
        raise NotImplementedError

    def result(self) -> EpisodeResult:
        raise NotImplementedError

    @property
    def messages(self) -> list[Message]:
        return []

    @property
    def done(self) -> bool:
        return True

    def reference_turns(self, task_id: str) -> list[list[str]]:
        return [[]]


class TagOutsideVocabulary(ThermostatEnv):
    """Its judge invents a tag of its own for a failed turn."""

    def judge(self):
        verdict = super().judge()
        return dataclasses.replace(verdict, tags=tuple(t if t == "pass" else "wrong_room" for t in verdict.tags))


class StepsAfterDone(ThermostatEnv):
    """Overrides ``step`` and forgets to refuse a step once the episode is over."""

    def step(self, assistant_text: str) -> StepResult:
        if self.done:
            return StepResult([], 0, True, True, Outcome.COMPLETED, 0)
        return super().step(assistant_text)


class ClashingPrefix(ThermostatEnv):
    """Its task ids would look like the toy env's."""

    kind = "clash"
    task_prefix = "toy"


class NotAnEnvironment:
    """Has the methods' names but is no ``Environment``."""

    def reset(self, task_id: str) -> list[Message]:
        return []
