"""Hydra config composition for `seal` commands (compose API, no chdir), and the config's groups
typed: trainer, learner, generator and model, each read here once (``Settings.of``) and nowhere else
with a default of its own; tests/unit/seal/test_config_groups.py holds them to their YAML's keys."""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue, OmegaConfBaseException

from learner.config import LearnerConfig
from seal.config_checks import at_least, check_fields
from seal.config_paths import resolve_overrides, use_python_path


def config_dir() -> Path:
    path = Path(os.environ.get("SEAL_CONFIG_DIR", Path(__file__).resolve().parent.parent / "configs"))
    if not (path / "config.yaml").is_file():
        raise RuntimeError(f"no config.yaml in {path}; set SEAL_CONFIG_DIR to the repo's configs/ folder")
    return path


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    for item in overrides:  # Hydra's grammar error for a bare word names no fix
        if "=" not in item and not item.startswith("~"):
            raise ValueError(
                f"{item!r} is not an override: settings are KEY=VALUE (e.g. trainer.steps=2) or GROUP=OPTION"
            )
    composed, folders = resolve_overrides(overrides, config_dir())  # GROUP=PATH.yaml, SEAL_CONFIG_PATH
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=composed)
        if folders:  # a file's folder first: its _target_ lives beside it
            cfg.python_path = [*folders, *python_path(cfg)]
        use_python_path(python_path(cfg))
        return cfg
    except (HydraException, OmegaConfBaseException) as exc:
        # Hydra's messages span lines (with the search path); keep one line.
        text = " ".join(str(exc).split("\nConfig search path")[0].split())
        raise ValueError(_misspelt(text, overrides, config_name) or "bad config: " + text) from None


def python_path(cfg: DictConfig) -> list[str]:
    """The folders a run's processes import a user's ``_target_`` from (configs/config.yaml sets
    ``python_path``, [] for none; a recorded run that predates it reads [], run_dir.PREDATED)."""
    if "python_path" not in cfg:
        raise ValueError("python_path is not set (configs/config.yaml sets it: [] for none)")
    return [str(folder) for folder in cfg.python_path]


def target_of(node: Mapping[str, Any], group: str) -> str:
    """The class a resolved config node names (its ``_target_``), or ValueError naming the key."""
    target = node["_target_"] if "_target_" in node else None
    if not isinstance(target, str) or not target:
        raise ValueError(f"{group}._target_ is not set (each {group} option of configs/{group}/ names its class)")
    return target


def _misspelt(text: str, overrides: list[str], config_name: str) -> str | None:
    """For Hydra's "Could not override 'KEY'" (whose advice, +KEY=..., adds the misspelt key) and
    "Could not find 'GROUP/OPTION'": one line with the close matches, or None."""
    if m := re.match(r"Could not override '([^']+)'", text):
        key = m[1]
        rest = [o for o in overrides if o.partition("=")[0] != key]
        try:
            cfg = compose(rest, config_name) if rest != list(overrides) else None
        except ValueError:
            cfg = None
        cfg = cfg if cfg is not None else compose([], config_name)
        return f"{key} is not a config key{did_you_mean(cfg, key)} (`seal train --cfg` prints them all)"
    if m := re.match(r"In '[^']*': Could not find '([^'/]+)/([^']+)' Available options in '[^']*': (.*)", text):
        close = difflib.get_close_matches(m[2], m[3].split(), n=1)
        hint = f"; did you mean {m[1]}={close[0]}?" if close else ""
        return f"{m[1]}={m[2]}: no such option (the {m[1]} options are {m[3]}){hint}"
    return None


def did_you_mean(cfg: DictConfig, key: str) -> str:
    """'; did you mean A or B?' for the keys of ``cfg`` closest to ``key`` (dotted), or ''."""

    def keys(node: Any, prefix: str = "") -> list[str]:
        if not isinstance(node, dict):
            return []
        out = []
        for k, v in node.items():
            out.append(f"{prefix}{k}")
            out += keys(v, f"{prefix}{k}.")
        return out

    every = keys(OmegaConf.to_container(cfg, resolve=False))
    parent, _, name = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in every if k.rpartition(".")[0] == parent}
    # A misspelt last part among its siblings first (trainer.stepz: steps), then the whole path (tranier.steps).
    close = [siblings[n] for n in difflib.get_close_matches(name, list(siblings), n=2, cutoff=0.6)]
    close = close or difflib.get_close_matches(key, every, n=2, cutoff=0.85)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def instantiate(node, **kwargs):
    from hydra.utils import instantiate as hydra_instantiate

    try:
        return hydra_instantiate(node, **kwargs, _convert_="all")
    except Exception as exc:  # hydra wraps constructor errors; keep the cause's message
        cause = exc.__cause__ or exc
        raise ValueError(f"bad config for {OmegaConf.select(node, '_target_')}: {cause}") from None


def instantiate_spec(spec: dict) -> Any:
    """Build a component from a resolved plain-dict config (what crosses into a
    Ray actor: OmegaConf nodes are resolved in the driver first)."""
    return instantiate(OmegaConf.create(spec))


# ------------------------------------------------------------------ the trainer group
@dataclass(frozen=True, kw_only=True)  # built from a mapping: fields in the YAML's order
class TrainerConfig:
    """The ``trainer:`` group, typed. Its values are written once, in configs/config.yaml (recipes,
    algos and ablations override some); this class says what each must be, so a bad one is one
    line before anything starts. ``TrainerConfig.of(cfg)`` builds it from a composed config."""

    mode: Literal["sync", "async"]
    steps: int = at_least(1)
    groups_per_step: int = at_least(1)
    max_staleness: int = at_least(0)
    stale_policy: Literal["drop", "downweight"]
    reissue_after_s: float = field(metadata={"above": 0})
    checkpoint_every: int = at_least(0, "0: never")
    storage: str | None
    checkpoint_keep: int = at_least(0, "0: keep all")
    # The slowest storage (MB/s) a checkpoint, its resume and a snapshot may meet: each may take
    # learner.timeout_s plus its bytes at this rate (seal/estimate/io_bounds.py).
    storage_min_mb_s: float = field(metadata={"above": 0})
    snapshot_every: int = at_least(0, "0: A_0 and the end of each run only")
    closed_loop: bool
    per_category_guidelines: bool
    skip_overlong: bool
    filter_groups: Literal["none", "zero_variance"]
    oversample: int = at_least(0)  # async mode only (admission_oversample)
    min_group_size: int | None = at_least(1, "null: the whole group")
    episode_deadline_s: float | None = field(metadata={"above": 0, "why": "null: no deadline"})
    episode_version: Literal["latest", "pinned"]  # pinned: an episode's turns on its first turn's version
    reference_logprobs: Literal["learner", "generator"]  # generator: the KL reference from the replicas (LoRA)
    fill_patience: int = at_least(1, "batches of filtered groups")
    unfilled: Literal["skip", "partial"]
    weight_canary: bool
    canary_max_logprob_diff: float = field(metadata={"above": 0})

    def __post_init__(self) -> None:
        check_fields(self, {f.name: f"trainer.{f.name}" for f in fields(self)})
        if self.mode == "async" and self.max_staleness < 1:
            raise ValueError("trainer.mode=async needs trainer.max_staleness >= 1 (0 is sync mode)")

    @classmethod
    def of(cls, cfg: DictConfig) -> TrainerConfig:
        """From a composed config's ``trainer`` node (resolved)."""
        return cls.from_mapping(_mapping(OmegaConf.to_container(cfg.trainer, resolve=True)))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainerConfig:
        names = [f.name for f in fields(cls)]
        unknown = [k for k in values if k not in names]
        if unknown:
            raise ValueError(f"trainer.{unknown[0]} is not a trainer setting (they are: {', '.join(names)})")
        missing = [k for k in names if k not in values]
        if missing:
            raise ValueError(f"trainer.{missing[0]} is not set (configs/config.yaml sets every trainer setting)")
        return cls(**values)

    @property
    def sync(self) -> bool:
        return self.mode == "sync"

    @property
    def admission_oversample(self) -> int:
        """Groups admitted beyond the staleness bound: none in sync mode, where a group admitted
        ahead of its batch could only wait out the next update and be dropped as stale (every
        group generated trains, or is filtered and refilled, or fails and is re-issued)."""
        return 0 if self.sync else self.oversample

    @property
    def staleness(self) -> int:
        """Policy versions a group may lag: 0 in sync mode, whatever max_staleness says."""
        return 0 if self.sync else self.max_staleness


@dataclass(frozen=True, kw_only=True)  # built from a mapping: fields in the YAML's order
class LearnerGroupConfig:
    """The ``learner:`` group, typed: its ranks, their bounds, and ``cfg``, the learner's own settings
    (learner/config.py LearnerConfig, built here from the same node as each rank builds it, so the
    driver and the ranks read one value). Every key is configs/learner/base/learner.yaml's: one the
    group or the driver needs that is missing is an error here, never a default."""

    model_path: str
    group_size: int
    world_size: int = at_least(1, "learner ranks")
    timeout_s: float = field(metadata={"above": 0})  # every collective of the ranks' group and control call
    step_timeout_s: float = field(metadata={"above": 0})  # one training step on every rank
    cfg: LearnerConfig

    # Keys of ``cfg`` the driver reads, required here (LearnerConfig checks their values).
    DRIVER_KEYS: ClassVar[tuple[str, ...]] = ("backend", "device", "mini_batch_groups")

    def __post_init__(self) -> None:
        check_fields(self, {f.name: f"learner.{f.name}" for f in fields(self)})

    @property
    def backend(self) -> str:
        return self.cfg.backend

    @property
    def device(self) -> str:
        return self.cfg.device

    @property
    def mini_batch_groups(self) -> int:
        return self.cfg.mini_batch_groups

    @property
    def process_group_backend(self) -> str:
        """The ranks' training group: NCCL on CUDA, gloo on the CPU."""
        return "nccl" if self.device == "cuda" else "gloo"

    @classmethod
    def of(cls, cfg: DictConfig) -> LearnerGroupConfig:
        """From a composed config's ``learner`` node."""
        return cls.from_spec(_container(cfg, "learner"))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> LearnerGroupConfig:
        """From the resolved ``learner`` node (the spec each rank builds its learner from)."""
        names = [f.name for f in fields(cls) if f.name != "cfg"]
        _required(spec, "learner", {**{n: n for n in names}, **{k: f"cfg.{k}" for k in cls.DRIVER_KEYS}})
        return cls(**{n: spec[n] for n in names}, cfg=instantiate_spec(dict(spec["cfg"])))


@dataclass(frozen=True, kw_only=True)  # built from a mapping: fields in the YAML's order
class GeneratorConfig:
    """The ``generator:`` group, typed: every key of configs/generator/'s options. The keys every
    option writes are required (one missing is an error here, never a default); the others are
    some engines' only and None where an option leaves them out: a blocking engine has no update
    timeout (its updates get the fleet's own bound), a CPU engine no GPU memory share."""

    target: str  # _target_: the engine's class
    model_path: str
    max_model_len: int
    device: str
    dtype: str
    tensor_parallel_size: int = at_least(1)
    enable_prefix_caching: bool
    enforce_eager: bool
    seed: int
    weight_sync: Literal["reload", "broadcast"]
    replicas: int = at_least(1, "engines behind the router")
    gpu_memory_utilization: float | None  # the CUDA options'
    cpu_kv_cache_gb: float | None  # the CPU options': GiB per worker
    cpu_threads_bind: str | int | None  # the blocking CPU engine's
    max_num_seqs: int | None  # the async engine's, as the four below
    update_mode: str | None
    update_timeout_s: float | None = field(metadata={"above": 0})
    drain_timeout_s: float | None = field(metadata={"above": 0})
    max_lora_rank: int | None  # set by hand only: the adapters' vLLM rank (None: the learner's, rounded up)
    max_loras: int | None = at_least(1, "adapters a batch may use")  # set by hand only (None: the engine's, 2)

    OPTIONAL: ClassVar[tuple[str, ...]] = (
        "gpu_memory_utilization",
        "cpu_kv_cache_gb",
        "cpu_threads_bind",
        "max_num_seqs",
        "update_mode",
        "update_timeout_s",
        "drain_timeout_s",
        "max_lora_rank",
        "max_loras",
    )
    # Optional keys no option of configs/generator/ writes: a user adds them (+generator.KEY=...).
    BY_HAND: ClassVar[tuple[str, ...]] = ("max_lora_rank", "max_loras")

    def __post_init__(self) -> None:
        check_fields(self, {f.name: f"generator.{'_target_' if f.name == 'target' else f.name}" for f in fields(self)})
        memory = "gpu_memory_utilization" if self.device == "cuda" else "cpu_kv_cache_gb"
        if getattr(self, memory) is None:  # what `seal plan` sizes the KV cache by
            raise ValueError(f"generator.{memory} is not set (each {self.device} option of configs/generator/ sets it)")

    # A blocking engine's options set no update timeout: the fleet bounds its updates by this.
    BLOCKING_UPDATE_TIMEOUT_S: ClassVar[float] = 600.0

    @property
    def fleet_update_timeout_s(self) -> float:
        """How long the fleet waits for a replica to load an update before restoring it."""
        return self.BLOCKING_UPDATE_TIMEOUT_S if self.update_timeout_s is None else self.update_timeout_s

    @classmethod
    def of(cls, cfg: DictConfig) -> GeneratorConfig:
        return cls.from_spec(_container(cfg, "generator"))

    @classmethod
    def from_spec(cls, node: Mapping[str, Any]) -> GeneratorConfig:
        """From the resolved ``generator`` node; keys of a user's engine beyond these are its own."""
        keys = [f.name for f in fields(cls) if f.name not in cls.OPTIONAL]
        values = _required(node, "generator", {k: "_target_" if k == "target" else k for k in keys})
        optional: dict[str, Any] = {k: node.get(k) for k in cls.OPTIONAL}  # None: an option leaves it out
        return cls(**values, **optional)


@dataclass(frozen=True)
class ModelConfig:
    """The ``model:`` group: the weights and their context (configs/model/), and ``spec``, the
    architecture `seal plan` reads when ``path`` is not on this machine (configs/model_specs/<spec>:
    the recipes set it; None: the bundled models' own, or the config.json at ``path``)."""

    path: str
    max_model_len: int
    spec: str | None
    family: str | None  # the chat template's family (None: told by the model)
    chat_template_kwargs: dict[str, Any] | None  # given to every render of the chat template

    OPTIONAL: ClassVar[tuple[str, ...]] = ("spec", "family", "chat_template_kwargs")

    def __post_init__(self) -> None:
        check_fields(self, {f.name: f"model.{f.name}" for f in fields(self)})

    @classmethod
    def of(cls, cfg: DictConfig) -> ModelConfig:
        node = _container(cfg, "model")
        values = _required(node, "model", {"path": "path", "max_model_len": "max_model_len"})
        optional: dict[str, Any] = {k: node.get(k) for k in cls.OPTIONAL}  # None: an option leaves it out
        return cls(**values, **optional)


@dataclass(frozen=True)
class Settings:
    """The typed groups of one composed config, built once from it (``Settings.of``) and handed to
    `seal plan`, preflight, `seal rehearse` and the run, so each reads the values the others do."""

    trainer: TrainerConfig
    learner: LearnerGroupConfig
    generator: GeneratorConfig
    model: ModelConfig
    recipe: str | None  # recipe.name (None: no recipe)

    @classmethod
    def of(cls, cfg: DictConfig) -> Settings:
        recipe = OmegaConf.select(cfg, "recipe.name")
        model = ModelConfig.of(cfg)  # first: the learner and the generator read model.path
        trainer = TrainerConfig.of(cfg)
        return cls(trainer, LearnerGroupConfig.of(cfg), GeneratorConfig.of(cfg), model, recipe and str(recipe))


def _container(cfg: DictConfig, group: str) -> dict[str, Any]:
    """The resolved ``group`` node; a key left at ``???`` is one line naming it."""
    try:
        return OmegaConf.to_container(cfg[group], resolve=True, throw_on_missing=True)  # type: ignore[return-value]
    except MissingMandatoryValue as exc:
        raise ValueError(f"{exc.full_key or group} must be set") from None
    except InterpolationToMissingValueError as exc:  # e.g. learner.model_path: ${model.path}
        missing = re.search(r"Missing mandatory value: (\S+)", str(exc))
        raise ValueError(f"{missing[1] if missing else exc.full_key} must be set ({exc.full_key} reads it)") from None


def _mapping(node: object) -> dict[str, Any]:
    """A resolved config node that must be a mapping (OmegaConf.to_container's type admits lists)."""
    if not isinstance(node, dict):
        raise ValueError(f"expected a mapping of settings, got {type(node).__name__}")
    return node


def _required(node: Mapping[str, Any], group: str, paths: Mapping[str, str]) -> dict[str, Any]:
    """``paths``' values (name -> dotted key in ``node``), or ValueError naming the first key not set."""
    out = {}
    for name, path in paths.items():
        value: Any = node
        for part in path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                raise ValueError(f"{group}.{path} is not set (each {group} option of configs/{group}/ sets it)")
            value = value[part]
        out[name] = value
    return out


def recorded_trainer(node: DictConfig) -> dict[str, Any]:
    """A run's recorded trainer settings (RUN_DIR/config.yaml) as TrainerConfig takes them: a
    setting the run predates reads as configs/config.yaml has it now, and one since retired
    (e.g. max_filtered_per_step) is left out; the run's own values win."""
    today = _mapping(OmegaConf.to_container(OmegaConf.load(config_dir() / "config.yaml").trainer, resolve=True))
    recorded = _mapping(OmegaConf.to_container(node, resolve=True))
    return {**today, **{k: v for k, v in recorded.items() if k in today}}


def rebase_targets(node: DictConfig) -> int:
    """A run recorded before a module moved names classes by their old paths (``_target_`` in
    RUN_DIR/config.yaml): each that no longer imports is pointed at the class of the same name in
    today's configs/, found by reading them. Returns how many were re-pointed."""
    today: dict[str, str] = {}
    for path in config_dir().rglob("*.yaml"):
        for line in path.read_text().splitlines():
            key, _, value = line.strip().partition(":")
            if key == "_target_" and value.strip():
                today.setdefault(value.strip().rpartition(".")[2], value.strip())

    def importable(target: str) -> bool:
        module, _, name = target.rpartition(".")
        try:
            return importlib.util.find_spec(module) is not None and hasattr(importlib.import_module(module), name)
        except ImportError:
            return False

    moved = 0

    def walk(n: Any) -> None:
        nonlocal moved
        if isinstance(n, DictConfig):
            target = n.get("_target_") if "_target_" in n else None
            if isinstance(target, str) and not importable(target) and target.rpartition(".")[2] in today:
                n._target_ = today[target.rpartition(".")[2]]
                moved += 1
            for key in n:
                walk(n._get_node(key))
        elif isinstance(n, ListConfig):
            for item in n:
                walk(item)

    walk(node)
    return moved
