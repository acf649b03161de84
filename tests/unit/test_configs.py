"""Every config file composes, and each group instantiates its component."""
from __future__ import annotations

from pathlib import Path

import pytest

from seal.config import compose, config_dir, instantiate

GROUP_FILES = sorted(p for p in config_dir().glob("*/*.yaml"))


def test_there_are_config_groups():
    assert {p.parent.name for p in GROUP_FILES} >= {"env", "interface"}


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_each_group_option_composes_and_instantiates(path: Path):
    cfg = compose([f"{path.parent.name}={path.stem}"])
    component = instantiate(cfg[path.parent.name])
    assert type(component).__name__ in {"BfclEnv", "ToyToolEnv", "InterfaceState"}


def test_root_config_defaults():
    cfg = compose([])
    assert cfg.split == "train" and cfg.env.tool_format == "json"
    assert instantiate(cfg.interface).schema_lite is True


def test_bad_overrides_are_clear_errors():
    with pytest.raises(ValueError, match="bad config"):
        compose(["env=nope"])
    with pytest.raises(ValueError, match="tool_format"):
        instantiate(compose(["env.tool_format=xml"]).env)
