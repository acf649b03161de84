"""Shared-prefix packing: a group's rollouts forwarded as one sequence.

The n rollouts of a GRPO group start from the same prompt (on BFCL ~6K of a
~6.5K-token trajectory), so forwarding them one by one computes that prompt n
times. Packed, a row holds the common prefix once, then each rollout's own
continuation, with position ids that restart each continuation at the prefix
length. Attention (``shared_prefix_attention``, registered with transformers
as ``seal_shared_prefix``) runs in two parts per row: the prefix causally on
its own (SDPA's causal kernel skips the masked half), then all continuation
queries against prefix + continuations with a mask that lets each see the
prefix and its own earlier tokens only. One 4D mask over the whole row would
give the same numbers but cost more than the unpacked forward: a masked SDPA
computes every block of the square, so the prefix's half that causality
skips would come back, and at BFCL lengths attention is most of the work.

Every token thus sees exactly the context it had in its own sequence, so the
log-probabilities are the unpacked ones (up to float summation order), and the
gradient of a shared position sums the contributions of every rollout that
uses it, as the unpacked loss does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ATTENTION = "seal_shared_prefix"
LAYOUT_KWARG = "seal_packed_rows"  # forward kwarg transformers passes down to the attention function


@dataclass(frozen=True)
class RowLayout:
    """One packed row: ``prefix`` shared tokens, ``length`` real tokens, and
    ``continuation_mask`` [length - prefix, length] (True: may attend) for the
    continuation queries."""

    prefix: int
    length: int
    continuation_mask: Any


@dataclass(frozen=True)
class PackedRows:
    """Packed rows for one micro-batch.

    ``input_ids``/``position_ids``: [R, W]; ``rows``: the layout of each row;
    ``sample_row[i]``: the row of sample i; ``logit_index``: [B, T] (T =
    longest sample - 1), the packed position whose logits predict token j + 1
    of sample i (0 past a sample's end)."""

    input_ids: Any
    position_ids: Any
    rows: list[RowLayout]
    sample_row: list[int]
    logit_index: Any

    @property
    def packed_tokens(self) -> int:
        return sum(r.length for r in self.rows)

    def forward_kwargs(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, LAYOUT_KWARG: self.rows}


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix all sequences share."""
    if not sequences:
        return 0
    shortest = min(len(s) for s in sequences)
    first = sequences[0]
    for j in range(shortest):
        token = first[j]
        if any(s[j] != token for s in sequences[1:]):
            return j
    return shortest


def row_groups(groups: Sequence[Any]) -> list[list[int]]:
    """Sample indices per row: consecutive samples with the same group key share a row."""
    rows: list[list[int]] = []
    for i, g in enumerate(groups):
        if rows and groups[rows[-1][0]] == g:
            rows[-1].append(i)
        else:
            rows.append([i])
    return rows


def pack_shared_prefix(token_ids: Sequence[Sequence[int]], groups: Sequence[Any], device: Any = "cpu") -> PackedRows:
    """Pack the samples of a micro-batch, one row per run of same-group samples."""
    import torch

    if len(token_ids) != len(groups):
        raise ValueError(f"{len(token_ids)} samples but {len(groups)} group keys")
    if any(len(s) < 2 for s in token_ids):
        raise ValueError("every sample needs at least 2 tokens (one to predict)")
    members_per_row = row_groups(groups)
    plans = []  # per row: (prefix, [(sample, offset of its continuation)], length)
    for members in members_per_row:
        seqs = [token_ids[i] for i in members]
        prefix = common_prefix_length(seqs) if len(seqs) > 1 else len(seqs[0])
        offset, conts = prefix, []
        for i in members:
            conts.append((i, offset))
            offset += len(token_ids[i]) - prefix
        plans.append((prefix, conts, offset))
    width = max(length for _, _, length in plans)
    ids = torch.zeros((len(plans), width), dtype=torch.long)
    pos = torch.zeros((len(plans), width), dtype=torch.long)
    logit_index = torch.zeros((len(token_ids), max(len(s) for s in token_ids) - 1), dtype=torch.long)
    sample_row = [0] * len(token_ids)
    rows = []
    for r, (prefix, conts, length) in enumerate(plans):
        ids[r, :prefix] = torch.tensor(token_ids[conts[0][0]][:prefix], dtype=torch.long)
        pos[r, :prefix] = torch.arange(prefix)
        cmask = torch.zeros((length - prefix, length), dtype=torch.bool)
        cmask[:, :prefix] = True
        for i, off in conts:
            seq = token_ids[i]
            c = len(seq) - prefix
            sample_row[i] = r
            if c:
                ids[r, off : off + c] = torch.tensor(seq[prefix:], dtype=torch.long)
                pos[r, off : off + c] = torch.arange(prefix, len(seq))
                cmask[off - prefix : off - prefix + c, off : off + c] = torch.ones((c, c), dtype=torch.bool).tril()
            j = torch.arange(len(seq) - 1)
            logit_index[i, : len(seq) - 1] = torch.where(j < prefix, j, off + j - prefix)
        rows.append(RowLayout(prefix, length, cmask.to(device)))
    return PackedRows(ids.to(device), pos.to(device), rows, sample_row, logit_index.to(device))


def shared_prefix_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """transformers attention function (query [B, H, W, D], key/value [B, KVH, W, D] -> [B, W, H, D], None).

    Without a packed layout in the kwargs (an ordinary right-padded batch) it
    is SDPA's causal attention; padded positions' outputs are never read."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows: list[RowLayout] | None = kwargs.pop(LAYOUT_KWARG, None)
    if rows is None:
        return sdpa_attention_forward(
            module, query, key, value, None, dropout=dropout, scaling=scaling, is_causal=True, **kwargs
        )
    if len(rows) != query.shape[0]:
        raise ValueError(f"{len(rows)} packed row layouts for a batch of {query.shape[0]}")
    width = query.shape[2]
    outputs = []
    for r, row in enumerate(rows):
        q, k, v = query[r : r + 1], key[r : r + 1], value[r : r + 1]
        parts = []
        if row.prefix:
            out, _ = sdpa_attention_forward(
                module,
                q[:, :, : row.prefix],
                k[:, :, : row.prefix],
                v[:, :, : row.prefix],
                None,
                dropout=dropout,
                scaling=scaling,
                is_causal=True,
                **kwargs,
            )
            parts.append(out)
        if row.length > row.prefix:
            out, _ = sdpa_attention_forward(
                module,
                q[:, :, row.prefix : row.length],
                k[:, :, : row.length],
                v[:, :, : row.length],
                row.continuation_mask[None, None],
                dropout=dropout,
                scaling=scaling,
                is_causal=False,
                **kwargs,
            )
            parts.append(out)
        if width > row.length:  # padding of a shorter row: never read
            parts.append(query.new_zeros((1, width - row.length, query.shape[1], query.shape[3])))
        outputs.append(torch.cat(parts, dim=1))
    return torch.cat(outputs, dim=0), None


def use_shared_prefix_attention(model) -> None:
    """Route ``model``'s attention through ``shared_prefix_attention`` (SDPA underneath)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, shared_prefix_attention)
    model.set_attn_implementation(ATTENTION)


def packed_token_logprobs(
    logits: Any, kept: Any, packed: PackedRows, targets: Any, mask: Any, with_entropy: bool = False
) -> tuple[Any, Any]:
    """log p(target) per sample and column from the packed rows' logits.

    ``logits``: [R, K, V] at packed positions ``kept`` (sorted, [K]);
    ``targets``/``mask``: [B, T] (token j + 1 of sample i; 1 where scored).
    Returns ([B, T] log-probs, 0 where not scored; [B, T] entropy or None)."""
    import torch

    lse = torch.logsumexp(logits, dim=-1)  # [R, K]
    rows = torch.tensor(packed.sample_row, dtype=torch.long, device=logits.device)[:, None].expand_as(mask)
    where = mask.bool()
    r, idx = rows[where], packed.logit_index[where]
    k = torch.searchsorted(kept, idx)
    picked = logits[r, k, targets[where]] - lse[r, k]
    logp = torch.zeros(mask.shape, dtype=logits.dtype, device=logits.device)
    logp[where] = picked
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = lse - (probs * logits).sum(-1)  # [R, K]: H = logsumexp - E_p[logit]
        entropy = torch.zeros(mask.shape, dtype=logits.dtype, device=logits.device)
        entropy[where] = ent[r, k]
    return logp, entropy


def needed_positions(packed: PackedRows, mask: Any) -> Any:
    """Sorted packed positions whose logits some scored token needs (``logits_to_keep``)."""
    import torch

    return torch.unique(packed.logit_index[mask.bool()])
