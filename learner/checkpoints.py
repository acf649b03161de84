"""Learner checkpoints: model, optimizer, step and RNG states plus the caller's extra state.

DeepSpeed writes every rank's ZeRO shard under one tag folder per save
(``stepNNNNNNN``); rank 0 writes the metadata (``learner.json``) and prunes
old tags; each rank keeps its own RNG streams (torch's CPU and, with CUDA, every
device's generator, Python's, numpy's). Resume needs the same backend,
ZeRO stage (configured and run: one rank runs stage 1 or 2 as 0), world size and LoRA rank, and is
exact. Under LoRA only the adapter's tensors are saved (the base weights load from the model path).

A save replaces the files of the one before it (torch_state.pt, the RNG files, learner.json) only once
every new file is whole: each is written beside its old one as ``*.partial`` and renamed over it after
all are written, learner.json last. A write that fails (the disk full) removes its partial files and
leaves the previous checkpoint as it was, loadable; it raises one line saying so (torch's own error
for a full disk is an "enforce fail ... unexpected pos" from its zip writer).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from learner.ds_config import effective_zero_stage
from learner.lora import load_trainable_state, lora_on, trainable_state

_TAG = re.compile(r"step(\d+)")


def step_tag(step: int) -> str:
    """The folder DeepSpeed writes a step's shards under."""
    return f"step{step:07d}"


def tags_to_prune(names: list[str], keep: int) -> list[str]:
    """The step tags beyond the newest ``keep`` (by step number); other names are never touched."""
    steps = {n: int(m[1]) for n in names if (m := _TAG.fullmatch(n))}
    tags = sorted(steps, key=steps.__getitem__)
    return tags[:-keep] if keep > 0 else []


def prune_tags(path: Path, keep: int) -> list[str]:
    gone = tags_to_prune([p.name for p in path.iterdir() if p.is_dir()], keep)
    for name in gone:
        shutil.rmtree(path / name, ignore_errors=True)
    return gone


def _rng_file(learner, path: Path) -> Path:
    return path / ("rng.pt" if learner.rank == 0 else f"rng_rank{learner.rank}.pt")


def cuda_rng_state(torch) -> dict[str, Any]:
    """Every CUDA device's generator state (dropout and sampling on the GPU draw from these, not from
    the CPU generator), under "cuda"; nothing without CUDA."""
    return {"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}


def set_cuda_rng_state(torch, rng: Mapping[str, Any], path: Path) -> None:
    """Restore what ``cuda_rng_state`` saved. A checkpoint written without CUDA has no CUDA streams to
    restore; one written with CUDA, resumed without it, has nothing to restore them into (nothing
    draws from them there); with CUDA it needs as many visible devices as wrote it."""
    states = rng.get("cuda")
    if states is None or not torch.cuda.is_available():
        return
    if len(states) != torch.cuda.device_count():
        raise ValueError(
            f"checkpoint {path} holds CUDA RNG states for {len(states)} device(s); "
            f"this process sees {torch.cuda.device_count()}"
        )
    torch.cuda.set_rng_state_all(states)


def written_stage(meta: Mapping[str, Any], tag_dir: Path) -> int:
    """The ZeRO stage DeepSpeed ran when it wrote ``tag_dir``: learner.json says so; a checkpoint from
    before it did is read from its files (stages 1-3 keep the optimizer in ZeRO shards, 0 does not)."""
    if "effective_zero_stage" in meta:
        return int(meta["effective_zero_stage"])
    return int(meta["zero_stage"]) if any(tag_dir.glob("*optim_states.pt")) else 0


def check_effective_stage(meta: Mapping[str, Any], tag_dir: Path, running: int) -> None:
    """Refuse, in one line, a checkpoint DeepSpeed wrote at another stage than it runs now: the optimizer
    state does not load across stages (DeepSpeed fails deep in its load with an AttributeError or
    TypeError). Stage 1 or 2 on one rank runs stage 0 (learner/ds_config.py effective_zero_stage)."""
    written = written_stage(meta, tag_dir)
    if written != running:
        hint = "; offload_optimizer=true keeps stage 2 on one rank" if written and not running else ""
        raise ValueError(
            f"checkpoint {tag_dir.parent} was written by DeepSpeed running ZeRO stage {written} (configured "
            f"{meta['zero_stage']}), this learner runs stage {running}: its optimizer state cannot load{hint}"
        )


PARTIAL = ".partial"
_FULL_BYTES = 1 << 20  # less free than this when a write failed: the disk was full


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written whole; the previous one is kept (one line)."""


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _disk_full(folder: Path, exc: BaseException) -> bool:
    """Whether a failed write met a full filesystem: ENOSPC anywhere in the error's chain, or (torch's
    zip writer says only "unexpected pos") next to no room left in ``folder`` while its partials stand."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "errno", None) == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    return _free_bytes(folder) < _FULL_BYTES


def write_error(folder: Path, what: str, exc: BaseException, full: bool) -> CheckpointWriteError:
    """The one line for a checkpoint write that failed (``full``: on a full filesystem)."""
    if full:
        return CheckpointWriteError(
            errno.ENOSPC,
            f"no space left on device writing {what} to {folder} ({_free_bytes(folder) / 2**20:.1f} MB free "
            "after removing the partial files): the previous checkpoint there is kept whole; free space, "
            "then resume=RUN_DIR",
        )
    return CheckpointWriteError(
        f"{what} to {folder} failed ({type(exc).__name__}: {exc}); the previous checkpoint is kept"
    )


def write_whole(files: Mapping[Path, Any], what: str) -> None:
    """Each ``path -> write(file)`` into ``path.partial`` (an open binary file), then every partial
    renamed over its path in the given order (the one naming the checkpoint last). Any failure removes
    the partials and raises ``CheckpointWriteError``: "no space left" when the filesystem was full,
    else the cause. The file is ours, closed on the way out: given a path, torch's zip writer keeps its
    own handle open as long as the error's traceback lives (in a Ray actor: on), and the unlinked
    partial holds the disk full."""
    written: list[Path] = []
    try:
        for path, write in files.items():
            partial = path.with_name(path.name + PARTIAL)
            written.append(partial)
            with open(partial, "wb") as fh:
                write(fh)
    except Exception as exc:
        folder = next(iter(files)).parent
        full = _disk_full(folder, exc)  # before the partials go
        for partial in written:
            try:
                os.truncate(partial, 0)  # the blocks go back even if some handle is still open
            except OSError:
                pass
            partial.unlink(missing_ok=True)
        raise write_error(folder, what, exc, full) from exc
    for partial in written:
        os.replace(partial, partial.with_name(partial.name[: -len(PARTIAL)]))


def save_learner(learner, path: Path, extra: Mapping[str, Any] | None, keep: int) -> Path:
    """``keep`` > 0: only the newest ``keep`` DeepSpeed tags stay."""
    import torch

    path.mkdir(parents=True, exist_ok=True)
    rng = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        **cuda_rng_state(torch),
    }
    cfg = learner.cfg
    meta = {"step": learner.step, "backend": cfg.backend, "zero_stage": cfg.zero_stage, "extra": dict(extra or {})}
    if learner.engine is not None:  # what DeepSpeed ran (stage 0 for zero2 on one rank): its files' layout
        meta["effective_zero_stage"] = effective_zero_stage(cfg, learner.world_size)
    lora = lora_on(cfg)  # only the adapter's tensors: the frozen base comes from model_path (learner/lora.py)
    if lora:
        meta["lora_rank"] = cfg.lora.rank
    files: dict[Path, Any] = {}
    what = f"the learner checkpoint of step {learner.step} (rank {learner.rank})"
    if learner.engine is not None:  # DeepSpeed's own files go to a new tag folder: learner.json names it last
        try:
            learner.engine.save_checkpoint(
                str(path), tag=step_tag(learner.step), client_state={"seal": meta}, exclude_frozen_parameters=lora
            )
        except Exception as exc:
            full = _disk_full(path, exc)
            shutil.rmtree(path / step_tag(learner.step), ignore_errors=True)  # no partial tag takes the room
            raise write_error(path, what, exc, full) from exc
    else:
        model = trainable_state(learner.model) if lora else learner.model.state_dict()
        state = {"model": model, "optimizer": learner.optimizer.state_dict()}
        files[path / "torch_state.pt"] = lambda fh: torch.save(state, fh)
    files[_rng_file(learner, path)] = lambda fh: torch.save(rng, fh)
    meta["world_size"] = learner.world_size
    if learner.rank == 0:
        files[path / "learner.json"] = lambda fh: fh.write(json.dumps(meta, indent=2).encode())
    write_whole(files, what)
    if learner.rank == 0 and keep and learner.engine is not None:
        prune_tags(path, keep)
    return path


def load_learner(learner, path: Path) -> dict[str, Any]:
    import torch

    meta_file = path / "learner.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"no learner checkpoint in {path}")
    meta = json.loads(meta_file.read_text())
    cfg = learner.cfg
    if (meta["backend"], meta["zero_stage"]) != (cfg.backend, cfg.zero_stage):
        raise ValueError(
            f"checkpoint was written by {meta['backend']} stage {meta['zero_stage']}, this learner is {cfg.backend} stage {cfg.zero_stage}"
        )
    lora = lora_on(cfg)
    if meta.get("lora_rank") != (cfg.lora.rank if lora else None):
        raise ValueError(
            f"checkpoint {path} was written with LoRA rank {meta.get('lora_rank')}, "
            f"this learner trains {f'rank {cfg.lora.rank}' if lora else 'every weight'}"
        )
    if meta.get("world_size", 1) != learner.world_size:
        raise ValueError(
            f"checkpoint {path} was written by {meta.get('world_size', 1)} learner ranks, this group has {learner.world_size}"
        )
    if learner.engine is not None:
        # The tag learner.json names, not DeepSpeed's `latest`: rank 0 writes `latest` once its own files
        # are saved, before the barrier that waits for the other ranks, so a rank lost mid-save leaves
        # `latest` naming an incomplete tag; learner.json is written after that barrier.
        tag = step_tag(int(meta["step"]))
        if not (path / tag).is_dir():
            raise FileNotFoundError(f"learner checkpoint {path} names step {meta['step']}, but {path / tag} is missing")
        check_effective_stage(meta, path / tag, effective_zero_stage(cfg, learner.world_size))
        loaded, _ = learner.engine.load_checkpoint(str(path), tag=tag, load_module_strict=not lora)
        if loaded is None:
            raise FileNotFoundError(f"DeepSpeed found no checkpoint {tag} in {path}")
    else:
        state = torch.load(path / "torch_state.pt", weights_only=False)
        if lora:
            load_trainable_state(learner.model, state["model"], path)
        else:
            learner.model.load_state_dict(state["model"])
        learner.optimizer.load_state_dict(state["optimizer"])
    rng = torch.load(_rng_file(learner, path), weights_only=False)
    torch.set_rng_state(rng["torch"])
    set_cuda_rng_state(torch, rng, path)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    learner.step = int(meta["step"])
    return meta["extra"]
