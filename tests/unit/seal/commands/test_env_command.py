"""`seal env`'s env choice (seal/commands/env.py env_for) for an environment from outside env_pool:
its task ids are known once env=NAME has built it, and a task of another env is still refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from seal.commands.env import env_for
from seal.errors import CliError


def test_an_outside_env_named_on_the_command_line_serves_its_own_task_ids():
    env = env_for(SimpleNamespace(overrides=["env=thermostat"]), "thermo_1")
    assert type(env).__name__ == "ThermostatEnv" and env.reset("thermo_1")[-1]["role"] == "user"
    with pytest.raises(CliError, match="task toy_1 is a toy task, not thermostat's: leave out env=thermostat"):
        env_for(SimpleNamespace(overrides=["env=thermostat"]), "toy_1")
