"""The typed config groups (seal/config.py) against every YAML file that sets their keys: a key
added to a YAML file without its field fails here, and so does a required field an option leaves
out. The files read are each group's options (configs/<group>/) and the overlays that set the
group's keys from the root (algo, ablation, recipe)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from learner.batch import APatchConfig
from learner.config import LearnerConfig
from learner.loss import LossConfig
from seal.config import (
    GeneratorConfig,
    LearnerGroupConfig,
    ModelConfig,
    Settings,
    TrainerConfig,
    compose,
    config_dir,
)

OVERLAYS = ("algo", "ablation", "recipe")  # @package _global_ files: they set keys of other groups


def _load(path: Path) -> dict[str, Any]:
    return {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}


def options(group: str) -> dict[str, dict[str, Any]]:
    """Each file of ``configs/<group>/`` (sub-folders included: learner/base, learner/sizes)."""
    return {str(p.relative_to(config_dir())): _load(p) for p in sorted((config_dir() / group).rglob("*.yaml"))}


def set_by_overlays(group: str) -> dict[str, dict[str, Any]]:
    """What each overlay file sets under ``group``."""
    found = {}
    for overlay in OVERLAYS:
        for p in sorted((config_dir() / overlay).glob("*.yaml")):
            node = _load(p).get(group)
            if isinstance(node, dict):
                found[str(p.relative_to(config_dir()))] = node
    return found


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def unknown(files: dict[str, dict[str, Any]], known: set[str], path: str = "") -> list[str]:
    """``file: key`` for each key under ``path`` (dotted) of each file that ``known`` lacks."""
    out = []
    for name, node in files.items():
        for part in filter(None, path.split(".")):
            node = node.get(part) or {}
        out += [f"{name}: {path + '.' if path else ''}{k}" for k in node if k != "_target_" and k not in known]
    return out


def test_the_settings_hold_every_typed_group():
    assert {f.type for f in dataclasses.fields(Settings)} >= {
        "TrainerConfig",
        "LearnerGroupConfig",
        "GeneratorConfig",
        "ModelConfig",
    }


def test_every_trainer_key_set_anywhere_is_a_field():
    assert unknown({"config.yaml": _load(config_dir() / "config.yaml")["trainer"]}, names(TrainerConfig)) == []
    assert unknown(set_by_overlays("trainer"), names(TrainerConfig)) == []


def test_the_learner_group_and_its_learner_config_cover_every_key():
    files = {**options("learner"), **set_by_overlays("learner")}
    base = _load(config_dir() / "learner" / "base" / "learner.yaml")
    # The group's own keys are the base file's, every one of them typed and required.
    assert set(base) - {"_target_"} == names(LearnerGroupConfig)
    assert unknown(files, names(LearnerGroupConfig)) == []
    for option in (config_dir() / "learner").glob("*.yaml"):  # torch, zero2, zero3: the base and its backend
        assert set(LearnerGroupConfig.DRIVER_KEYS) <= set(base["cfg"]) | set(_load(option)["cfg"]), option.name
    # learner.cfg, its loss and its A-Patch settings: the learner's own typed configs
    # (LearnerConfig's betas is the one field no file sets).
    assert unknown(files, names(LearnerConfig), "cfg") == []
    assert unknown(files, names(LossConfig), "cfg.loss") == []
    assert unknown(files, names(APatchConfig), "cfg.apatch") == []


@pytest.mark.parametrize(
    "group, cls",
    [("generator", GeneratorConfig), ("model", ModelConfig)],
)
def test_each_option_sets_the_required_fields_and_no_key_outside_the_type(group, cls):
    fields = {"_target_" if n == "target" else n for n in names(cls)}
    optional = set(cls.OPTIONAL)
    assert optional <= fields
    for name, node in options(group).items():
        assert sorted(set(node) - fields) == [], f"{name} sets keys {cls.__name__} lacks"
        assert sorted(fields - optional - set(node)) == [], f"{name} leaves out required keys of {cls.__name__}"
    for name, node in set_by_overlays(group).items():
        assert sorted(set(node) - fields) == [], f"{name} sets keys {cls.__name__} lacks"


def test_every_generator_key_is_set_by_some_option():
    """Every key but those a user sets by hand (GeneratorConfig.BY_HAND), which no option writes."""
    written = set().union(*(set(node) for node in options("generator").values()))
    keys = {"_target_" if n == "target" else n for n in names(GeneratorConfig) - set(GeneratorConfig.BY_HAND)}
    assert keys == written and not written & set(GeneratorConfig.BY_HAND)


@pytest.mark.parametrize(
    "overrides",
    [[], ["recipe=qwen7b_2x8"], ["recipe=qwen3b_1x4"], ["generator=vllm_cpu", "learner=torch"], ["generator=vllm_gpu"]],
)
def test_every_composed_config_builds_its_settings(overrides):
    cfg = compose(overrides)
    s = Settings.of(cfg)
    assert (s.learner.world_size, s.generator.replicas, s.model.path) == (
        cfg.learner.world_size,
        cfg.generator.replicas,
        cfg.model.path,
    )
    assert s.learner.cfg.lr == cfg.learner.cfg.lr and s.recipe == (cfg.recipe.name if "recipe" in cfg else None)


def test_a_key_an_option_must_set_is_one_line_when_missing():
    with pytest.raises(ValueError, match=r"^generator.cpu_kv_cache_gb is not set \(each cpu option"):
        Settings.of(compose(["~generator.cpu_kv_cache_gb"]))
    with pytest.raises(ValueError, match=r"^generator.gpu_memory_utilization is not set \(each cuda option"):
        Settings.of(compose(["generator=vllm_gpu", "~generator.gpu_memory_utilization"]))
    with pytest.raises(ValueError, match=r"^model.path must be set$"):
        Settings.of(compose(["model=local"]))
    with pytest.raises(ValueError, match=r"^learner.step_timeout_s is not set \(each learner option"):
        Settings.of(compose(["~learner.step_timeout_s"]))
