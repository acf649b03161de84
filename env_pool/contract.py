"""The environment contract, checked: a broken environment is one line naming the environment and
the method, before any actor starts (docs/custom-environment.md).

- ``check_env_class``: the class is an ``Environment`` that implements every method, and its task
  ids can be told apart from every other environment's (a ``kind`` and a ``task_prefix`` of its own).
- ``check_verdict``: a verdict's tags and labels come from the vocabularies of env_pool/tags.py
  (the coordinator's weights, the capability state and the guidelines know no others), one each
  per user turn, and its reward is a number in [0, 1] (env_pool/base.py says why those bounds).
  ``MultiTurnEnv.result`` runs it on every episode.
- ``check_episode``: one task played three times (a correct agent's steps, an agent that never
  calls a tool, and the correct agent's first step alone: a partial answer): every verdict
  checked, the correct one succeeds, and a step after the episode ended is refused. `seal train`
  runs it on the first training task in its preflight.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from env_pool import tags as T
from env_pool.base import Environment, EpisodeResult, EpisodeStateError, play_scripted

DOC = "docs/custom-environment.md"
TAGS = frozenset(T.RELEASED_TAGS) | {T.UNKNOWN}
LABELS = frozenset(T.PAPER_LABELS) | {T.UNKNOWN}


class EnvContractError(ValueError):
    """An environment breaks the contract: one line naming the environment and the method."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_env_class(cls: object, known: Mapping[str, tuple[str, Callable[[str], str]]], builtin: Iterable[str]) -> None:
    """``known``: kind -> (task prefix, category_of) of every environment (env_pool.registry.environments());
    ``builtin``: the kinds env_pool ships."""
    if not isinstance(cls, type) or not issubclass(cls, Environment):
        raise EnvContractError(f"env {cls!r} is not an env_pool.base.Environment: subclass it ({DOC})")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise EnvContractError(f"env {_name(cls)} does not implement {', '.join(missing)} ({DOC})")
    if not (isinstance(cls.success_threshold, (int, float)) and 0 < cls.success_threshold <= 1):
        raise EnvContractError(
            f"env {_name(cls)}: success_threshold {cls.success_threshold!r} is not in (0, 1]: the reward "
            f"at or above which an episode counts as solved ({DOC})"
        )
    if cls.task_prefix == "" and cls.kind in set(builtin):
        return  # a built-in environment, or a subclass playing its tasks
    if cls.kind in ("", "base") or not cls.task_prefix:
        raise EnvContractError(f"env {_name(cls)} sets no kind or task_prefix: both name its tasks ({DOC})")
    if cls.category_of.__func__ is Environment.category_of.__func__:  # type: ignore[attr-defined]
        raise EnvContractError(f"env {_name(cls)} does not implement category_of ({DOC})")
    for kind, (prefix, _) in known.items():
        if kind == cls.kind and prefix != cls.task_prefix:
            raise EnvContractError(f"env {_name(cls)}: kind {kind!r} is taken by another environment ({DOC})")
        if kind != cls.kind and (prefix.startswith(cls.task_prefix) or cls.task_prefix.startswith(prefix)):
            raise EnvContractError(
                f"env {_name(cls)}: task_prefix {cls.task_prefix!r} overlaps env {kind}'s {prefix!r}: choose another"
            )


def check_reward(where: str, reward: object) -> None:
    """A number in [0, 1]; NaN, infinities, strings and None are refused by value."""
    ok = isinstance(reward, (int, float)) and math.isfinite(reward) and 0 <= reward <= 1
    if not ok:
        raise EnvContractError(f"{where}: reward {reward!r} is not a number in [0, 1] ({DOC})")


def check_verdict(env: Environment, reward: float, tags: Sequence[str], labels: Sequence[str]) -> None:
    where = f"env {_name(type(env))}.judge"
    check_reward(where, reward)
    if not tags or len(tags) != len(labels):
        raise EnvContractError(f"{where}: {len(tags)} tags and {len(labels)} labels: give one of each per user turn")
    if bad := [t for t in tags if t not in TAGS]:
        raise EnvContractError(f"{where}: tag {bad[0]!r} is not in the vocabulary (env_pool.tags.RELEASED_TAGS; {DOC})")
    if bad := [label for label in labels if label not in LABELS]:
        raise EnvContractError(
            f"{where}: label {bad[0]!r} is not in the vocabulary (env_pool.tags.PAPER_LABELS; {DOC})"
        )


def check_episode(env: Environment, task_id: str, category: str) -> None:
    """``category``: the task's category as the registry gives it (evaluation splits by it)."""
    name = _name(type(env))
    if task_id not in env.task_ids("all"):
        raise EnvContractError(f"env {name}.task_ids: 'all' does not list {task_id!r} ({DOC})")
    reference = env.reference_turns(task_id)
    results = []
    partial = [reference[0][:1]] if reference and reference[0] else []
    for turns in (reference, [["I cannot help with that."]] * len(reference), partial):
        result = play_scripted(env, task_id, turns)
        if not isinstance(result, EpisodeResult):
            raise EnvContractError(f"env {name}.result: returned {type(result).__name__}, not an EpisodeResult")
        check_verdict(env, result.reward, result.tags, result.labels)
        if result.success != (result.reward >= env.success_threshold):
            raise EnvContractError(
                f"env {name}.result: success {result.success} with reward {result.reward}: success is the reward "
                f"reaching success_threshold {env.success_threshold} ({DOC})"
            )
        if (result.task_id, result.env, result.category) != (task_id, env.kind, category):
            raise EnvContractError(
                f"env {name}.result: says task {result.task_id!r} of env {result.env!r} in category "
                f"{result.category!r}; played {task_id!r} of {env.kind!r}, category_of says {category!r}"
            )
        _check_step_after_done(env, name)
        results.append(result)
    if not results[0].success:
        raise EnvContractError(
            f"env {name}.reference_turns: a correct agent's steps for {task_id} earn reward {results[0].reward} "
            f"from judge, under its success_threshold {env.success_threshold} (tags {results[0].tags}): "
            "the verifier and the reference disagree"
        )


def _check_step_after_done(env: Environment, name: str) -> None:
    if not env.done:
        raise EnvContractError(f"env {name}.done: False after result() ({DOC})")
    try:
        env.step("one step too many")
    except EpisodeStateError:
        return
    raise EnvContractError(f"env {name}.step: took a step after the episode was done; raise EpisodeStateError ({DOC})")
