"""The run directory every `seal train` writes (config, overrides, seed, code version), and the
config a run is read back with: by `seal train resume=RUN_DIR` (its own config, settings on top)
and by `seal evaluate RUN_DIR`."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from seal.config import config_dir, did_you_mean, python_path, rebase_targets, recorded_trainer, target_of
from seal.config_paths import use_python_path

# What a resume cannot change, and why: the checkpoint holds this model's weights in this
# learner layout, and the task stream's slots (replay/slots.py) index this pool in this order.
RESUME_FIXED = {
    "model": "the checkpoint holds this model's weights",
    "learner.world_size": "the checkpoint is sharded over this many learner ranks",
    "learner.cfg.backend": "the checkpoint is in this learner's format",
    "learner.cfg.zero_stage": "the checkpoint is in this ZeRO stage's layout",
    "env": "the task stream's slots index this env's tasks",
    "split": "the task stream's slots index this split",
    "limit": "the task stream's slots index this many tasks",
    "seed": "the task stream's order comes from the seed",
    "n": "a group in flight at the checkpoint has this many rollouts",
    "trainer.groups_per_step": "the task stream admits groups by the batch",
    "evaluation.validation_size": "the training pool leaves these tasks out",
    "evaluation.heldout_categories": "the training pool leaves these categories out",
}


def code_version(repo: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def create_run_dir(requested: str | None, cfg, overrides: list[str]) -> Path:
    repo = Path(__file__).resolve().parents[2]
    path = Path(requested) if requested else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "overrides": overrides,
        "seed": cfg.seed,
        "code_version": code_version(repo),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    run_file = path / "run.json"
    if run_file.is_file():  # a resumed run: keep the original record, log the continuation
        record = json.loads(run_file.read_text())
        record.setdefault("resumed", []).append(meta)
        (path / f"config.resume{len(record['resumed'])}.yaml").write_text(OmegaConf.to_yaml(cfg))
    else:
        record = meta
        (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    run_file.write_text(json.dumps(record, indent=2))
    return path


def latest_config_file(run_dir: Path) -> Path:
    """The config the run last ran with: config.yaml, or the config.resumeK.yaml of its latest resume."""
    resumes = sorted(run_dir.glob("config.resume*.yaml"), key=lambda p: int(p.stem[len("config.resume") :] or 0))
    return resumes[-1] if resumes else run_dir / "config.yaml"


# Learner-group and fleet settings a run may predate, as the code before them ran: the typed reads
# (seal/config.py LearnerGroupConfig, GeneratorConfig) refuse a config without them.
PREDATED = {
    "learner.world_size": 1,
    "learner.timeout_s": 600.0,
    "learner.step_timeout_s": 3600.0,
    "generator.replicas": 1,
    "generator.weight_sync": "reload",
    "generator.tensor_parallel_size": 1,
    "python_path": [],  # no folders of the user's
}


def recorded_config(run_dir: Path, latest: bool = False):
    """A run's recorded config, readable by today's code: the evaluation group's defaults where the
    run predates it, its trainer settings as TrainerConfig takes them, the PREDATED settings it lacks,
    classes that moved re-pointed.
    ``latest``: as its latest resume ran it (else as it started). FileNotFoundError: not a run."""
    path = latest_config_file(run_dir) if latest else run_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = OmegaConf.load(path)
    assert isinstance(cfg, DictConfig), path  # a run's config: a mapping
    OmegaConf.set_struct(cfg, False)
    if "evaluation" not in cfg:
        cfg.evaluation = OmegaConf.load(config_dir() / "evaluation" / "default.yaml")
    cfg.trainer = recorded_trainer(cfg.trainer)  # every setting, as the typed TrainerConfig takes them
    for key, value in PREDATED.items():
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            OmegaConf.update(cfg, key, value, force_add=True)
    rebase_targets(cfg)  # classes a run recorded before they moved: today's paths

    use_python_path(python_path(cfg))  # a _target_ of the user's, where the run found it
    return cfg


_ABSENT = object()


def apply_settings(cfg, settings: Iterable[str], what: str) -> None:
    """``key=value`` settings on a recorded config (values read as YAML). A key the config lacks
    needs ``+`` (did-you-mean otherwise); a config group choice (``cluster=multinode``) cannot
    apply to a resolved config. ``what`` names the command for the messages."""
    groups = {p.name for p in config_dir().iterdir() if p.is_dir()}
    for item in settings:
        key, sep, value = item.partition("=")
        plain = key.lstrip("+")
        if not sep or not plain or "/" in key or key.startswith("~"):
            raise ValueError(f"{what} takes key=value settings on the run's config, got {item!r}")
        node = OmegaConf.select(cfg, plain, default=None)
        if plain in groups and "." not in plain and (node is None or isinstance(node, DictConfig)):
            raise ValueError(
                f"{what} reads the run's recorded config, where a config group is already chosen: "
                f"set its keys instead of {item!r} (e.g. {plain}.KEY=VALUE)"
            )
        if not key.startswith("+") and OmegaConf.select(cfg, plain, default=_ABSENT) is _ABSENT:
            raise ValueError(f"{plain} is not a key of the run's config{did_you_mean(cfg, plain)}")
        OmegaConf.update(cfg, plain, yaml.safe_load(value), force_add=True)


def resumed_config(run_dir: Path, settings: list[str]):
    """What `seal train resume=RUN_DIR [key=value ...]` continues with: the run's own config as it
    last ran, the settings on top. ValueError, in one line, before anything is written or started:
    RUN_DIR is no run, a setting is not key=value on it, or one changes what RESUME_FIXED names."""
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"nothing to resume: {run_dir} is not a run directory (no config.yaml)")
    before = recorded_config(run_dir, latest=True)
    for item in settings:
        key, _, value = item.partition("=")
        if key.lstrip("+") == "run_dir" and Path(value) != run_dir:  # a resumed run stays in its own directory
            raise ValueError(f"resume={run_dir} continues in {run_dir}: leave out {item}")
        if key in RESUME_FIXED and "." not in key and isinstance(_resolved(before, key), dict):  # model=, env=
            raise ValueError(
                f"resume={run_dir} cannot change {key} (the run's: {_short(_resolved(before, key))}; asked: {item}): "
                f"{RESUME_FIXED[key]}; start a new run (another run_dir) for that"
            )
    cfg = copy.deepcopy(before)
    apply_settings(cfg, settings, f"resume={run_dir}")
    for key, why in RESUME_FIXED.items():
        was, now = _resolved(before, key), _resolved(cfg, key)
        if was != now:
            raise ValueError(
                f"resume={run_dir} cannot change {key} ({_short(was)} -> {_short(now)}): {why}; "
                "start a new run (another run_dir) for that"
            )
    cfg.run_dir, cfg.resume = str(run_dir), str(run_dir)
    return cfg


def _resolved(cfg, key: str) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


def _short(value: Any) -> str:
    if isinstance(value, dict):  # a model by its path, an env by its class
        if "path" in value and value["path"]:
            return str(value["path"])
        return target_of(value, "env").rsplit(".", 1)[-1] if "_target_" in value else json.dumps(value)[:60]
    return repr(value)


def forget_start(run_dir: Path, was_empty: bool) -> None:
    """A run whose start failed (Ray, an engine, an actor) leaves no run behind to block the next
    try ("already holds a run"): its directory goes if this start made it (or found it empty), else
    its run.json; a resume's failed start drops its entry in run.json and its config.resumeK.yaml."""
    run_file = run_dir / "run.json"
    record = json.loads(run_file.read_text()) if run_file.is_file() else {}
    if record.get("resumed"):
        (run_dir / f"config.resume{len(record['resumed'])}.yaml").unlink(missing_ok=True)
        record["resumed"].pop()
        if not record["resumed"]:
            del record["resumed"]
        run_file.write_text(json.dumps(record, indent=2))
    elif was_empty:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        run_file.unlink(missing_ok=True)
