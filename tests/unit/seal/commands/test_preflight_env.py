"""`seal train`'s preflight holds a user's environment to the contract before any actor starts: each
broken env of tests/unit/env_pool/broken_envs.py is one line naming the env and the method, and the
example environment passes."""

from __future__ import annotations

import pytest

from seal.commands.preflight import preflight
from seal.errors import CliError

BROKEN = "tests.unit.env_pool.broken_envs"
CASES = [
    ("ForgotEnd", f"env {BROKEN}.ForgotEnd does not implement end (docs/custom-environment.md)"),
    ("TagOutsideVocabulary", f"env {BROKEN}.TagOutsideVocabulary.judge: tag 'wrong_room' is not in the vocabulary"),
    ("StepsAfterDone", f"env {BROKEN}.StepsAfterDone.step: took a step after the episode was done"),
    ("NotAnEnvironment", "is not an env_pool.base.Environment: subclass it"),
]


@pytest.mark.parametrize("name, fragment", CASES, ids=[c[0] for c in CASES])
def test_a_broken_env_is_one_line_naming_it_and_the_method(name, fragment):
    with pytest.raises(CliError) as exc:
        preflight(["env=thermostat", f"env._target_={BROKEN}.{name}", "model=tiny"])
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_an_env_module_that_does_not_import_names_the_fix():
    with pytest.raises(CliError) as exc:
        preflight(["env=thermostat", "env._target_=nowhere.env.Env", "model=tiny"])
    assert str(exc.value) == (
        "env._target_=nowhere.env.Env does not import (No module named 'nowhere'): give the env's config by its "
        "path (env=path/to/its.yaml puts that folder on the import path), or add the folder that holds nowhere "
        "with python_path=[FOLDER] (docs/custom-environment.md)"
    )


def test_the_example_env_passes():
    cfg, _ = preflight(["env=thermostat", "model=tiny"])
    assert cfg.env._target_ == "examples.thermostat.env.ThermostatEnv"
