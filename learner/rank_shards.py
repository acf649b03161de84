"""The learner group on the rank side: how a step's groups are split over the ranks, how the
ranks agree on one loss normaliser and one number of forward/backward calls, and how they form
their torch.distributed group. Pure functions where it is maths (tests/unit/test_learner_group_plan.py).

A GRPO group stays whole on one rank (its advantages and its shared-prefix packing need all its
rollouts); groups go to the rank with the fewest tokens so far, largest first. Every mini-batch's
scored-token and sequence counts are summed over the ranks, so each rank's loss is its share of
the global loss; DeepSpeed averages gradients over the ranks, so the loss is scaled by the world
size, and the N-rank update equals the 1-rank update on the same batch.

Unequal shares: DeepSpeed needs the same number of backward calls per rank per optimizer step
(ZeRO's reduce-scatter at the boundary; under ZeRO-3 every forward is a parameter all-gather too).
A rank with fewer micro-batches runs padding ones: a 2-token sample whose loss is multiplied by 0.
Padding instead of regrouping keeps whole groups on one rank and costs one tiny forward each.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from learner.batch import Sample
from learner.collectives import all_reduce_values
from learner.micro_batches import forwarded_tokens
from replay.messages import Trajectory
from weights.netif import use_node_interface

PAD_SAMPLE = Sample(
    token_ids=[0, 0],
    loss_mask=[0, 1],
    old_logprobs=[0.0, 0.0],
    advantage=0.0,
    raw_advantage=0.0,
    scale=1.0,
    num_tokens=0,
    group_id="<pad>",
    reference_logprobs=[0.0, 0.0],
)


@dataclass(frozen=True)
class Rendezvous:
    """Where the training group meets: rank 0's node address and a free port there."""

    host: str
    port: int
    rank: int
    world_size: int
    backend: str  # gloo (CPU) | nccl (CUDA)
    timeout_s: float  # every collective of the group
    wait_s: float  # how long a rank's call may wait for the one before it (the step timeout)


@dataclass(frozen=True)
class RankShard:
    """One rank's part of a step: its trajectories and, per mini-batch (one optimizer step,
    the same count on every rank), the ids of its groups there (possibly none)."""

    trajectories: list[Trajectory]
    mini_groups: list[list[str]] = field(default_factory=list)


def assign_groups(tokens: Sequence[int], world_size: int) -> list[list[int]]:
    """Group indices per rank: largest group first to the rank with the fewest tokens so far
    (ties: lower rank, earlier group). Each rank's list keeps the groups' original order."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for g in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        out[r].append(g)
        load[r] += tokens[g]
    return [sorted(x) for x in out]


def shard_batch(trajectories: Sequence[Trajectory], world_size: int, mini_batch_groups: int) -> list[RankShard]:
    """The driver's split of one step: groups in arrival order make mini-batches of
    ``mini_batch_groups`` (the last may be smaller: a partial step); each mini-batch's groups
    are balanced over the ranks by sequence tokens (what a forward costs)."""
    order: list[str] = []
    by_group: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        if t.group_id not in by_group:
            order.append(t.group_id)
            by_group[t.group_id] = []
        by_group[t.group_id].append(t)
    shards = [RankShard([], []) for _ in range(world_size)]
    for m in range(0, len(order), mini_batch_groups):
        ids = order[m : m + mini_batch_groups]
        tokens = [sum(len(t.token_ids) for t in by_group[g]) for g in ids]
        for rank, picked in enumerate(assign_groups(tokens, world_size)):
            shards[rank].mini_groups.append([ids[i] for i in picked])
            shards[rank].trajectories.extend(t for i in picked for t in by_group[ids[i]])
    return shards


def assigned_mini_batches(
    samples: Sequence[Sample], mini_groups: Sequence[Sequence[str]], micro_batch_size: int
) -> list[list[list[Sample]]]:
    """Mini-batches of micro-batches from the driver's assignment (a mini-batch may be empty here)."""
    by_group: dict[str, list[Sample]] = {}
    for s in samples:
        by_group.setdefault(s.group_id, []).append(s)
    missing = {g for mini in mini_groups for g in mini} ^ set(by_group)
    if missing:
        raise ValueError(f"the shard's groups and its mini-batch plan disagree on {sorted(missing)[:3]}")
    plan = []
    for mini in mini_groups:
        flat = [s for g in mini for s in by_group[g]]
        plan.append([flat[k : k + micro_batch_size] for k in range(0, len(flat), micro_batch_size)])
    return plan


def scores_nothing(micro: Sequence[Sample]) -> bool:
    """No token of the micro-batch is scored (token 0 never is): all infra-fault stand-ins (replay/queue.py)."""
    return all(not any(s.loss_mask[1:]) for s in micro)


def pad_plan(plan: list[list[list[Sample]]], micro_counts: Sequence[int]) -> list[list[list[Sample]]]:
    """Every mini-batch padded to the group's micro-batch count with [PAD_SAMPLE] micro-batches, and every
    micro-batch that scores nothing replaced by one: a forward with nothing to score has no graph to
    run a backward through (DeepSpeed's raises), and under ZeRO-3 a skipped forward skips its gathers."""
    if len(plan) != len(micro_counts) or any(len(m) > c for m, c in zip(plan, micro_counts)):
        raise ValueError(
            f"micro-batch counts {list(micro_counts)} do not cover this rank's plan {[len(m) for m in plan]}"
        )
    plan = [[[PAD_SAMPLE] if scores_nothing(micro) else micro for micro in mini] for mini in plan]
    return [mini + [[PAD_SAMPLE] for _ in range(c - len(mini))] for mini, c in zip(plan, micro_counts)]


def is_padding(micro: Sequence[Sample]) -> bool:
    return len(micro) == 1 and micro[0] is PAD_SAMPLE


def agree_on_mini_batches(
    plan: list[list[list[Sample]]], world_size: int
) -> tuple[list[list[list[Sample]]], list[int], list[int]]:
    """(padded plan, scored tokens per mini-batch, sequences per mini-batch), summed over the group.
    Two all-reduces over the training group (its timeout bounds them), on the device its backend
    serves (learner/collectives.py: CUDA under NCCL)."""
    tokens = [sum(s.num_tokens for micro in mini for s in micro) for mini in plan]
    sequences = [sum(len(micro) for micro in mini) for mini in plan]
    counts = [max(1, len(mini)) for mini in plan]
    if world_size == 1:
        return pad_plan(plan, counts), tokens, sequences

    sums = all_reduce_values(tokens + sequences, "sum")  # float64: token counts are exact far past 2**31
    most = all_reduce_values(counts, "max")
    n = len(plan)
    return pad_plan(plan, [int(v) for v in most]), [int(v) for v in sums[:n]], [int(v) for v in sums[n:]]


def agree_on_reference(plan: list[list[list[Sample]]], world_size: int) -> list[list[bool]]:
    """Per micro-batch of the (padded) plan: take the KL reference the trajectories carry (from the
    generator) instead of forwarding the reference model? Only where every sample of that micro-batch
    on every rank carries it (padding always does): under ZeRO-3 the reference forward gathers the
    layers' parameters, so a rank that skips it while another forwards leaves the group's collectives
    unmatched. One all-reduce over the training group when it has more than one rank."""
    forward = [
        [0.0 if all(s.reference_logprobs is not None for s in micro) else 1.0 for micro in mini] for mini in plan
    ]
    flat = [v for mini in forward for v in mini]
    if world_size > 1 and flat:
        flat = all_reduce_values(flat, "max")
    out, k = [], 0
    for mini in forward:
        out.append([not flat[k + j] for j in range(len(mini))])
        k += len(mini)
    return out


def agree_on_recompute(forwarded: list[list[int]], min_tokens: int, world_size: int) -> list[list[bool]]:
    """Per micro-batch of the (padded) plan: recompute its activations in the backward? ``forwarded``:
    the tokens each of this rank's micro-batches forwards. Chosen from the longest micro-batch at that
    place on any rank, so every rank chooses alike: under ZeRO-3 a recomputed forward gathers every
    layer's parameters again in the backward, and ranks that disagree make different collectives (the
    group dies or hangs). One all-reduce over the training group, only when the choice depends on length."""
    if min_tokens <= 0:
        return [[True] * len(mini) for mini in forwarded]
    flat = [n for mini in forwarded for n in mini]
    if world_size > 1 and flat:
        flat = [int(v) for v in all_reduce_values(flat, "max")]
    out, k = [], 0
    for mini in forwarded:
        out.append([n >= min_tokens for n in flat[k : k + len(mini)]])
        k += len(mini)
    return out


def recompute_choices(plan: list[list[list[Sample]]], cfg: Any, world_size: int) -> list[list[bool]] | None:
    """Gradient checkpointing per micro-batch of a learner with settings ``cfg`` (a LearnerConfig),
    the same choice on every rank; None when the learner never recomputes."""
    if not cfg.gradient_checkpointing:
        return None
    forwarded = [[forwarded_tokens(micro, cfg.shared_prefix) for micro in mini] for mini in plan]
    return agree_on_recompute(forwarded, cfg.gradient_checkpointing_min_tokens, world_size)


def join_group(rv: Rendezvous) -> None:
    """Form the training group (every rank calls this at once); DeepSpeed then finds it formed."""
    import torch.distributed as dist

    use_node_interface()  # gloo would advertise 127.0.0.1 where the hostname resolves to it (weights/netif.py)
    # DeepSpeed reads these; each actor sees only its own GPU (Ray sets CUDA_VISIBLE_DEVICES), so local rank 0.
    os.environ.update(
        RANK=str(rv.rank), WORLD_SIZE=str(rv.world_size), LOCAL_RANK="0", MASTER_ADDR=rv.host, MASTER_PORT=str(rv.port)
    )
    dist.init_process_group(
        rv.backend,
        init_method=f"tcp://{rv.host}:{rv.port}",
        rank=rv.rank,
        world_size=rv.world_size,
        timeout=timedelta(seconds=rv.timeout_s),
    )
