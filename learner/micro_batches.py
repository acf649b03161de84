"""How a batch of samples meets the model: mini-batches (one optimizer step each) of
micro-batches (one forward/backward each), and a micro-batch's tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from learner.batch import Sample
from learner.packing import packed_length


class MicroBatch(NamedTuple):
    """One micro-batch's tensors, right-padded to its longest sample: ``ids``/``attention`` [B, W];
    ``mask`` (1 where token j + 1 is scored), ``behaviour`` (the generator's logprob of token
    j + 1) [B, W - 1]; ``advantages`` [B, 1]; ``packed``: the shared-prefix rows (learner/packing.py)
    when the learner packs this micro-batch, else None; ``reference`` [B, W - 1]: the KL reference's
    logprob of token j + 1 from the generator when every sample carries it, else None."""

    ids: Any
    attention: Any
    mask: Any
    behaviour: Any
    advantages: Any
    packed: Any = None
    reference: Any = None


def packs(samples: Sequence[Sample], shared_prefix: bool) -> bool:
    """Whether the learner forwards this micro-batch packed: shared-prefix packing is on and two of its samples share a group."""
    groups = [s.group_id for s in samples]
    return shared_prefix and len(set(groups)) < len(groups)


def forwarded_tokens(samples: Sequence[Sample], shared_prefix: bool) -> int:
    """The tokens this micro-batch's forward runs over: packed (learner/packing.py) or each sample whole."""
    if packs(samples, shared_prefix):
        return packed_length([s.token_ids for s in samples], [s.group_id for s in samples])
    return sum(len(s.token_ids) for s in samples)


def collate(samples: Sequence[Sample], device: Any) -> MicroBatch:
    import torch

    width = max(len(s.token_ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1))
    old = torch.zeros((len(samples), width - 1))
    adv = torch.zeros((len(samples), 1))
    carried = all(s.reference_logprobs is not None for s in samples)
    ref = torch.zeros((len(samples), width - 1)) if carried else None
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        ids[i, :n] = torch.tensor(s.token_ids)
        attention[i, :n] = 1
        mask[i, : n - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        old[i, : n - 1] = torch.tensor(s.old_logprobs[1:], dtype=torch.float32)
        adv[i, 0] = s.advantage
        if ref is not None:
            ref[i, : n - 1] = torch.tensor(s.reference_logprobs[1:], dtype=torch.float32)  # type: ignore[index]
    return MicroBatch(
        ids.to(device),
        attention.to(device),
        mask.to(device),
        old.to(device),
        adv.to(device),
        reference=None if ref is None else ref.to(device),
    )


def plan_mini_batches(
    samples: Sequence[Sample], mini_batch_groups: int, group_size: int, micro_batch_size: int, allow_partial: bool
) -> list[list[list[Sample]]]:
    """Mini-batches of micro-batches. Every mini-batch holds ``mini_batch_groups`` whole groups of
    ``group_size``; with ``allow_partial`` the last may hold fewer."""
    per_mini = mini_batch_groups * group_size
    if (len(samples) % per_mini and not allow_partial) or not samples:
        groups = len({s.group_id for s in samples})
        raise ValueError(
            f"a batch must hold whole mini-batches of {mini_batch_groups} groups of {group_size}; "
            f"got {groups} groups of {len(samples) // max(groups, 1)}"
        )
    mb = micro_batch_size
    return [
        [
            list(samples[m + k : min(m + k + mb, m + per_mini, len(samples))])
            for k in range(0, min(per_mini, len(samples) - m), mb)
        ]
        for m in range(0, len(samples), per_mini)
    ]
