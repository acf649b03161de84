"""Hydra config composition for `seal` commands (compose API, no chdir)."""
from __future__ import annotations

import os
from pathlib import Path


def config_dir() -> Path:
    path = Path(os.environ.get("SEAL_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))
    if not (path / "config.yaml").is_file():
        raise RuntimeError(f"no config.yaml in {path}; set SEAL_CONFIG_DIR to the repo's configs/ folder")
    return path


def compose(overrides: list[str], config_name: str = "config"):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        # Hydra's messages span lines (with the search path); keep one line.
        text = str(exc).split("\nConfig search path")[0]
        raise ValueError("bad config: " + " ".join(text.split())) from None


def instantiate(node, **kwargs):
    from hydra.utils import instantiate as hydra_instantiate
    from omegaconf import OmegaConf

    try:
        return hydra_instantiate(node, **kwargs, _convert_="all")
    except Exception as exc:  # hydra wraps constructor errors; keep the cause's message
        cause = exc.__cause__ or exc
        raise ValueError(f"bad config for {OmegaConf.select(node, '_target_')}: {cause}") from None


def instantiate_spec(spec: dict):
    """Build a component from a resolved plain-dict config (what crosses into a
    Ray actor: OmegaConf nodes are resolved in the driver first)."""
    from omegaconf import OmegaConf

    return instantiate(OmegaConf.create(spec))
