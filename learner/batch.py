"""From trajectories to training samples: complete groups, advantages, A-Patch scales."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from learner.advantages import SCALE_MAX, SCALE_MIN, apply_scale, grpo_advantages, trajectory_scale
from replay.messages import Trajectory


@dataclass(frozen=True)
class APatchConfig:
    enabled: bool = True  # diagnosis weighting on/off (the "without reweighting" ablation)
    apply_to: str = "all"  # all | positive | negative
    vocabulary: str = "released"  # released (tags) | paper (labels)
    scale_min: float = SCALE_MIN  # w_j is clipped to [scale_min, scale_max] (release: [0.5, 2.0])
    scale_max: float = SCALE_MAX

    def __post_init__(self) -> None:
        # w_j > 0 is what keeps every advantage's sign.
        if not 0 < self.scale_min <= self.scale_max:
            raise ValueError(
                f"A-Patch clip range needs 0 < scale_min <= scale_max, got [{self.scale_min}, {self.scale_max}]"
            )
        if self.apply_to not in ("all", "positive", "negative"):
            raise ValueError(f"apply_to must be all, positive or negative, got {self.apply_to!r}")
        if self.vocabulary not in ("released", "paper"):
            raise ValueError(f"vocabulary must be released or paper, got {self.vocabulary!r}")


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float  # after A-Patch
    raw_advantage: float
    scale: float
    num_tokens: int  # unmasked tokens
    group_id: str = ""  # samples of one group share a prompt (shared-prefix packing)
    policy_versions: tuple[int, ...] = ()  # of its generated segments (mismatch metrics compare same-version ones)
    # The KL reference's log-probs from the generator (Trajectory.reference_logprobs); None: the learner forwards it.
    reference_logprobs: list[float] | None = None


@dataclass(frozen=True)
class BatchStats:
    groups: int
    trajectories: int
    zero_variance_groups: int
    mean_scale: float
    reward_mean: float


def group_trajectories(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Groups in first-seen order; every group complete (same size, distinct rollout indices)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) > 1:
        raise ValueError(f"groups of different sizes in one batch: {sorted(sizes)}")
    for gid, g in groups.items():
        if len({t.rollout_index for t in g}) != len(g):
            raise ValueError(f"group {gid} has duplicate rollout indices")
        if len({(t.task_id, t.interface_version) for t in g}) != 1:
            raise ValueError(f"group {gid} mixes tasks or interface versions")
    return [sorted(g, key=lambda t: t.rollout_index) for g in groups.values()]


def build_samples(
    trajectories: Sequence[Trajectory],
    weights: Mapping[str, float],
    cfg: APatchConfig = APatchConfig(),
    group_weights: Mapping[str, float] | None = None,
) -> tuple[list[Sample], BatchStats]:
    """``group_weights`` (group id -> factor in (0, 1]) scales whole groups'
    advantages: the replay queue down-weights groups past the staleness bound."""
    groups = group_trajectories(trajectories)
    group_weights = group_weights or {}
    for gid, w in group_weights.items():
        if not 0 < w <= 1:
            raise ValueError(f"group weight of {gid} must be in (0, 1], got {w}")
    samples: list[Sample] = []
    zero_var = 0
    scales = []
    for group in groups:
        # Stand-ins for infra-faulted members (replay/queue.py: nothing generated) are outside the
        # group's statistics: GRPO over the members the policy played, advantage 0 for the rest.
        adv = grpo_advantages([t.reward for t in group if not t.padding])
        zero_var += adv.zero_variance
        factor = group_weights.get(group[0].group_id, 1.0)
        played = iter(adv.advantages)
        for t in group:
            a = 0.0 if t.padding else next(played)
            tags = t.tags if cfg.vocabulary == "released" else t.labels
            scale = trajectory_scale(tags, weights, lo=cfg.scale_min, hi=cfg.scale_max) if cfg.enabled else 1.0
            if not t.padding:
                scales.append(scale)
            samples.append(
                Sample(
                    t.token_ids,
                    t.loss_mask,
                    t.logprobs,
                    factor * apply_scale(a, scale, cfg.apply_to),
                    a,
                    scale,
                    sum(t.loss_mask),
                    t.group_id,
                    tuple(t.policy_versions),
                    # A stand-in scores nothing: its reference is never read.
                    [0.0] * len(t.token_ids) if t.padding else t.reference_logprobs,
                )
            )
    played_rewards = [t.reward for g in groups for t in g if not t.padding]
    n = len(played_rewards)
    stats = BatchStats(
        len(groups),
        len(samples),
        zero_var,
        sum(scales) / n if n else 1.0,
        sum(played_rewards) / n if n else 0.0,
    )
    return samples, stats
