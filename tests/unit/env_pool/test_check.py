"""check_env (env_pool/check.py): the checks preflight runs, callable from a user's own pytest, on the
examples as a user would call it, and on an env that breaks the contract only on a later task."""

from __future__ import annotations

import pytest

from env_pool.check import check_env
from env_pool.contract import EnvContractError
from env_pool.toy.env import ToyToolEnv
from examples.minimal.units import UnitsEnv
from examples.thermostat.env import ThermostatEnv


def test_the_examples_and_a_built_in_env_pass_as_a_users_pytest_calls_it():
    check_env(UnitsEnv(), task_ids=["units_0", "units_7", "units_199"])
    check_env(ThermostatEnv())  # the first training task, as preflight plays it
    check_env(ToyToolEnv(), task_ids=["toy_1"])


def test_it_refuses_what_preflight_refuses_in_one_line():
    class Overpaid(UnitsEnv):
        def judge(self) -> float:
            return super().judge() * 2  # a correct answer earns 2.0

    with pytest.raises(EnvContractError) as exc:
        check_env(Overpaid(), task_ids=["units_3"])
    assert str(exc.value) == (
        f"env {__name__}.{Overpaid.__qualname__}.judge: reward 2.0 is not a number in [0, 1] "
        "(docs/custom-environment.md)"
    )
