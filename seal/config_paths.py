"""Configs beside the user's code, for every `seal` command that composes (docs/custom-environment.md):

- ``GROUP=path/to/NAME.yaml``: a file given by its path is that group's option ``NAME`` (a config
  group of SEAL's: ``env=my_env.yaml``, ``evaluation=my_eval.yaml``; its own ``defaults:`` may
  name SEAL's options, e.g. ``evaluation``'s ``default``), and its folder goes on ``python_path``;
- ``SEAL_CONFIG_PATH``: folders (``os.pathsep``-separated) laid out like configs/ (``env/NAME.yaml``,
  ``evaluation/NAME.yaml``, ...), searched after SEAL's own (Hydra's search path, not a replacement);
- an env without an evaluation config of its own gets ``evaluation=default``;
- ``python_path`` (root setting): folders put on the import path of this process and, through
  ``PYTHONPATH``, of every process it starts (Ray's workers on this machine), so a ``_target_``
  beside its config imports without PYTHONPATH fiddling. A run records it in its config.yaml, so
  `seal evaluate RUN_DIR` and a resume find the module again.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from omegaconf import OmegaConf

SEARCH_PATH_VAR = "SEAL_CONFIG_PATH"
_stored: set[tuple[str, str]] = set()  # (group, option) put in Hydra's ConfigStore from a file


def search_path() -> list[Path]:
    """``SEAL_CONFIG_PATH``'s folders; a missing one is an error (Hydra would only warn)."""
    dirs = [Path(p).expanduser().resolve() for p in os.environ.get(SEARCH_PATH_VAR, "").split(os.pathsep) if p]
    if missing := [str(d) for d in dirs if not d.is_dir()]:
        raise ValueError(f"{SEARCH_PATH_VAR} names {', '.join(missing)}: no such folder")
    return dirs


def options(group: str, roots: Iterable[Path]) -> set[str]:
    """The options of ``group``: files under each root's ``group/`` and those stored from a path."""
    found = {p.stem for root in roots for p in (root / group).glob("*.yaml")}
    return found | {name for g, name in _stored if g == group}


def is_file_value(value: str) -> bool:
    return value.endswith((".yaml", ".yml"))


def _store(group: str, path: Path, roots: Sequence[Path]) -> str:
    """The file as ``group``'s option named by its stem (Hydra's ConfigStore: no file is written)."""
    from hydra.core.config_store import ConfigStore

    name = path.name.rsplit(".", 1)[0]
    taken = [root / group / path.name for root in roots if (root / group / path.name).is_file()]
    if any(t.resolve() != path for t in taken):
        raise ValueError(f"{group}={path}: {taken[0]} is an option of that name already; rename your file")
    ConfigStore.instance().store(group=group, name=name, node=OmegaConf.load(path))
    _stored.add((group, name))
    return name


def resolve_overrides(overrides: Sequence[str], config_root: Path) -> tuple[list[str], list[str]]:
    """The overrides Hydra composes (file options stored and named, the search path and the evaluation
    default added) and the folders of the files given by path (python_path's additions)."""
    roots = [config_root, *search_path()]
    groups = {p.name for root in roots for p in root.iterdir() if p.is_dir()}
    out, folders = [], []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and key.lstrip("+") in groups and is_file_value(value):
            path = Path(value).expanduser().resolve()
            if not path.is_file():
                raise ValueError(f"{key}={value}: no such file")
            item = f"{key}={_store(key.lstrip('+'), path, roots)}"
            folders.append(str(path.parent))
        out.append(item)
    if len(roots) > 1:
        out.append("hydra.searchpath=[" + ",".join(f"file://{r}" for r in roots[1:]) + "]")
    chosen = {o.partition("=")[0]: o.partition("=")[2] for o in out if "=" in o}
    env = chosen.get("env")
    if env and "evaluation" not in chosen and env not in options("evaluation", roots):
        out.append("evaluation=default")  # an env of one's own without an evaluation config
    return out, folders


def use_python_path(folders: Iterable[str]) -> None:
    """Each folder first on this process's import path and on PYTHONPATH (inherited by the processes
    it starts, Ray's local workers among them); the order given is kept."""
    wanted = [str(Path(f).expanduser().resolve()) for f in folders]
    for folder in reversed(wanted):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([*[f for f in wanted if f not in current], *current])


def unimportable(target: str, exc: BaseException, group: str = "env") -> str:
    """One line for a ``_target_`` whose module does not import, naming the fix."""
    top = target.split(".")[0]
    here = Path.cwd()
    if (here / top).is_dir() or (here / f"{top}.py").is_file():  # e.g. examples/ of the SEAL checkout
        return (
            f"{group}._target_={target} does not import ({exc}): {top} is in {here}, which is not on the "
            f"import path: run with PYTHONPATH=$PWD, or add python_path=[{here}] (docs/custom-environment.md)"
        )
    return (
        f"{group}._target_={target} does not import ({exc}): give the {group}'s config by its path "
        f"({group}=path/to/its.yaml puts that folder on the import path), or add the folder that holds "
        f"{top} with python_path=[FOLDER] (docs/custom-environment.md)"
    )
