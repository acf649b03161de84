"""Configs beside the user's code (seal/config_paths.py): an env's YAML given by its path, a folder of
configs on SEAL_CONFIG_PATH, the default evaluation for an env without one, and python_path, which
makes the env's module import here and in what this process starts, and comes back with a run's
recorded config. Real files in a temporary folder, real composition, real imports."""

from __future__ import annotations

import importlib
import os
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seal.config import compose
from seal.errors import CliError

ENV_MODULE = '''
import random

from env_pool.tasks import IndexedSplits, Turn, TurnTask
from env_pool.tool_calls import ToolCall
from env_pool.tool_env import ToolEnv
from env_pool.tool_functions import ToolSet


def halve(n: int) -> float:
    """Half a number.

    n: The number.
    """
    return n / 2


class HalvingEnv(ToolEnv[TurnTask]):
    kind = "{kind}"
    splits = IndexedSplits("{kind}_", num_train=8, num_tasks=10)
    tools = ToolSet(halve)

    @classmethod
    def task_of(cls, task_id):
        n = 2 * random.Random(cls.splits.index(task_id)).randint(1, 50)
        return TurnTask(task_id, "even", (Turn(f"Half of {{n}}?", (ToolCall("halve", {{"n": n}}),), str(n // 2)),))

    def judge(self):
        return 1.0 if self.task.turns[0].reply in self.turn_texts[-1][-1] else 0.0
'''


@pytest.fixture
def isolated(monkeypatch):
    """sys.path and PYTHONPATH as they were after the test; no SEAL_CONFIG_PATH from outside."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("SEAL_CONFIG_PATH", raising=False)
    return monkeypatch


def user_project(root: Path, name: str) -> Path:
    """A user's folder outside SEAL: ``{name}.py`` (an env) and ``{name}.yaml`` (its config) side by side."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(ENV_MODULE.format(kind=name))
    (root / f"{name}.yaml").write_text(f"_target_: {name}.HalvingEnv\ntool_format: python\nstep_limit: 2\n")
    return root / f"{name}.yaml"


def test_an_env_config_given_by_its_path_composes_and_its_module_imports(isolated, tmp_path):
    config = user_project(tmp_path / "project", "halving_a")
    cfg = compose([f"env={config}", "n=2"])
    assert OmegaConf.to_container(cfg.env) == {
        "_target_": "halving_a.HalvingEnv",
        "tool_format": "python",
        "step_limit": 2,
    }
    assert list(cfg.python_path) == [str(config.parent)] and sys.path[0] == str(config.parent)
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(config.parent)  # Ray's local workers inherit it
    assert cfg.evaluation.validation_size == 40  # no evaluation config of its own: the default
    assert importlib.import_module("halving_a").HalvingEnv.kind == "halving_a"


def test_an_evaluation_config_beside_it_builds_on_the_default(isolated, tmp_path):
    config = user_project(tmp_path, "halving_b")
    (tmp_path / "halving_b_eval.yaml").write_text("defaults:\n  - default\n  - _self_\nvalidation_size: 2\n")
    cfg = compose([f"env={config}", f"evaluation={tmp_path / 'halving_b_eval.yaml'}"])
    assert cfg.evaluation.validation_size == 2 and list(cfg.evaluation.views) == ["validation", "id", "ood", "replay"]


def test_a_folder_of_configs_on_the_search_path_adds_options_and_keeps_seals(isolated, tmp_path):
    user_project(tmp_path / "code", "halving_c")
    configs = tmp_path / "configs"
    (configs / "env").mkdir(parents=True)
    (configs / "evaluation").mkdir()
    (configs / "env" / "halving_c.yaml").write_text("_target_: halving_c.HalvingEnv\nstep_limit: 3\n")
    (configs / "evaluation" / "halving_c.yaml").write_text("defaults:\n  - default\n  - _self_\nvalidation_size: 3\n")
    isolated.setenv("SEAL_CONFIG_PATH", str(configs))
    cfg = compose(["env=halving_c", f"python_path=[{tmp_path / 'code'}]"])
    assert cfg.env.step_limit == 3 and cfg.evaluation.validation_size == 3  # its own evaluation config, found
    assert importlib.import_module("halving_c").HalvingEnv.kind == "halving_c"
    assert compose(["env=toy"]).env._target_ == "env_pool.toy.env.ToyToolEnv"  # SEAL's options are still there


@pytest.mark.parametrize(
    "make, override, error",
    [
        (lambda d: None, "env={d}/absent.yaml", "env={d}/absent.yaml: no such file"),
        (
            lambda d: (d / "toy.yaml").write_text("_target_: x.Y\n"),
            "env={d}/toy.yaml",
            "is an option of that name already; rename your file",
        ),
    ],
)
def test_a_missing_file_or_a_name_seal_has_is_one_line(isolated, tmp_path, make, override, error):
    make(tmp_path)
    with pytest.raises(ValueError) as exc:
        compose([override.format(d=tmp_path)])
    assert error.format(d=tmp_path) in str(exc.value) and "\n" not in str(exc.value)


def test_a_missing_search_path_folder_is_one_line(isolated, tmp_path):
    isolated.setenv("SEAL_CONFIG_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=f"SEAL_CONFIG_PATH names {tmp_path / 'nowhere'}: no such folder"):
        compose([])


def test_seal_env_plays_an_env_given_by_path_and_names_the_fix_for_one_it_cannot_import(isolated, tmp_path):
    from seal.commands.env import env_for

    config = user_project(tmp_path, "halving_d")
    env = env_for(Namespace(overrides=[f"env={config}"]), "halving_d_3")
    assert env.kind == "halving_d" and env.reference_turns("halving_d_3")
    with pytest.raises(CliError, match="no environment has task id 'halving_e_1' .*; an env of your own: add env="):
        env_for(Namespace(overrides=[]), "halving_e_1")
    broken = tmp_path / "elsewhere" / "halving_e.yaml"
    broken.parent.mkdir()
    broken.write_text("_target_: not_on_any_path.HalvingEnv\n")
    with pytest.raises(CliError) as exc:
        env_for(Namespace(overrides=[f"env={broken}"]))
    assert str(exc.value).startswith(
        "env._target_=not_on_any_path.HalvingEnv does not import (No module named 'not_on_any_path'): give the env's "
        "config by its path (env=path/to/its.yaml puts that folder on the import path), or add the folder that "
        "holds not_on_any_path with python_path=[FOLDER]"
    )


def test_a_runs_recorded_config_brings_its_python_path_back(isolated, tmp_path):
    from seal.run.run_dir import recorded_config

    config = user_project(tmp_path / "project", "halving_f")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(OmegaConf.to_yaml(compose([f"env={config}"])))
    isolated.setattr(sys, "path", [p for p in sys.path if p != str(config.parent)])
    sys.modules.pop("halving_f", None)
    cfg = recorded_config(run)
    assert list(cfg.python_path) == [str(config.parent)] and str(config.parent) in sys.path
    assert importlib.import_module("halving_f").HalvingEnv.kind == "halving_f"


def test_the_root_settings_keep_python_path_empty_by_default():
    assert list(compose([]).python_path) == []


def test_a_module_in_the_current_folder_gets_the_pythonpath_fix(tmp_path, monkeypatch):
    from seal.config_paths import unimportable

    (tmp_path / "examples").mkdir()
    monkeypatch.chdir(tmp_path)
    line = unimportable("examples.thermostat.env.ThermostatEnv", ModuleNotFoundError("No module named 'examples'"))
    assert line == (
        "env._target_=examples.thermostat.env.ThermostatEnv does not import (No module named 'examples'): "
        f"examples is in {tmp_path}, which is not on the import path: run with PYTHONPATH=$PWD, or add "
        f"python_path=[{tmp_path}] (docs/custom-environment.md)"
    )
