"""Which tasks a run can play: the one rule `seal train`, `seal rollout` and
`seal eval` share for prompts that cannot fit the model's context.

A task whose opening prompt leaves fewer than ``sampling.max_new_tokens``
tokens of ``generator.max_model_len`` ends at once as a context overflow with
no generated token: a record (or a GRPO group) that says nothing about the
policy. The split part (``training_pool``) is cheap and runs before anything
starts; the fit part needs the tokenizer (a few seconds, no engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evaluation.views import training_task_ids
from seal.chat_setup import chat_tokenizer as configured
from seal.config import TrainerConfig, instantiate


def prompt_room(cfg) -> int:
    """Tokens an opening prompt may take and still leave room to answer."""
    return int(cfg.generator.max_model_len) - int(cfg.sampling.max_new_tokens)


def room_text(cfg) -> str:
    return (
        f"{prompt_room(cfg)} tokens (model context {cfg.generator.max_model_len} "
        f"minus sampling.max_new_tokens {cfg.sampling.max_new_tokens})"
    )


def chat_tokenizer(cfg):
    return configured(cfg)


@dataclass(frozen=True)
class Fit:
    keep: list[str]
    overlong: list[tuple[str, int]]  # (task id, opening prompt tokens), in task order

    def note(self, room: str) -> str:
        """``skipped 2 of 4 tasks: ...`` (empty when nothing was skipped)."""
        if not self.overlong:
            return ""
        ids = ", ".join(t for t, _ in self.overlong[:3]) + (", ..." if len(self.overlong) > 3 else "")
        return f"skipped {len(self.overlong)} of {len(self.keep) + len(self.overlong)} tasks ({ids}): opening prompt longer than {room}"


def fit_tasks(chat, env, interface, task_ids: Sequence[str], room: int) -> Fit:
    keep, overlong = [], []
    for task_id in task_ids:
        length = len(chat.prompt_ids(env.reset(task_id, interface)))
        if length <= room:
            keep.append(task_id)
        else:
            overlong.append((task_id, length))
    return Fit(keep, overlong)


def training_pool(cfg, env) -> list[str]:
    """The split's training tasks, first ``limit``, before the fit check."""
    # The update-validation view's tasks never serve as update evidence.
    task_ids = training_task_ids(
        env.task_ids(cfg.split),
        cfg.evaluation.validation_size,
        cfg.evaluation.heldout_categories,
        env.task_ids("train"),
    )
    if cfg.limit is not None:
        task_ids = task_ids[: int(cfg.limit)]
    if not task_ids:
        raise ValueError("no tasks to train on (check split and limit)")
    return task_ids


def select_tasks(cfg) -> tuple[list[str], int]:
    """`seal train`'s pool: the split's tasks, less those whose opening prompt
    cannot fit the model's context (they would only produce context-overflow
    groups: zero gradient) unless ``trainer.skip_overlong`` is false."""
    env = instantiate(cfg.env)
    task_ids = training_pool(cfg, env)
    if not TrainerConfig.of(cfg).skip_overlong:
        return task_ids, 0
    fit = fit_tasks(chat_tokenizer(cfg), env, instantiate(cfg.interface), task_ids, prompt_room(cfg))
    if not fit.keep:
        raise ValueError(f"no task's opening prompt fits {room_text(cfg)}")
    return fit.keep, len(fit.overlong)
