"""Shared-prefix packing: a group's rollouts forwarded as one sequence.

The n rollouts of a GRPO group start from the same prompt (on BFCL ~6K of a
~6.5K-token trajectory), so forwarding them one by one computes that prompt n
times. Packed, a row holds the common prefix once, then each rollout's own
continuation, with position ids that restart each continuation at the prefix
length. Attention (``shared_prefix_attention``, registered with transformers
as ``seal_shared_prefix``) runs in two parts per row: the prefix causally on
its own (SDPA's causal kernel skips the masked half), then each continuation's
queries against the prefix's keys and values and its own, the continuations
batched side by side (one SDPA call, a mask per continuation: the prefix and
its own earlier tokens). A masked SDPA computes every block of its square, so
one mask over the whole row would cost the square of the row (the prefix's
causal half back), and one over all continuations together the square of the
group's whole continuation length; side by side each continuation costs what
it would unpacked, c x (prefix + c), and the prefix is computed once.

Every token thus sees exactly the context it had in its own sequence, so the
log-probabilities are the unpacked ones (up to float summation order), and the
gradient of a shared position sums the contributions of every rollout that
uses it, as the unpacked loss does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from learner.split_attention import split_continuation_attention

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module

ATTENTION = "seal_shared_prefix"
LAYOUT_KWARG = "seal_packed_rows"  # forward kwarg transformers passes down to the attention function


@dataclass(frozen=True)
class RowLayout:
    """One packed row: ``prefix`` shared tokens, ``length`` real tokens. Its n continuations side by
    side, c = the longest: ``continuation_index`` [n, c], the row position of each continuation's
    j-th token (padding repeats a valid position); ``continuation_mask`` [n, 1, c, prefix + c] (True:
    may attend): each query sees the prefix and its own continuation causally; ``continuation_valid``
    [n * c], the flat indices of the real (not padding) queries, in row order."""

    prefix: int
    length: int
    continuation_index: Any = None
    continuation_mask: Any = None
    continuation_valid: Any = None


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


def _row_plans(token_ids: Sequence[Sequence[int]], groups: Sequence[Any]) -> list[tuple[int, list, int]]:
    """Per packed row: (prefix, [(sample, offset of its continuation)], length)."""
    plans = []
    for members in row_groups(groups):
        seqs = [token_ids[i] for i in members]
        prefix = common_prefix_length(seqs) if len(seqs) > 1 else len(seqs[0])
        offset, conts = prefix, []
        for i in members:
            conts.append((i, offset))
            offset += len(token_ids[i]) - prefix
        plans.append((prefix, conts, offset))
    return plans


def packed_length(token_ids: Sequence[Sequence[int]], groups: Sequence[Any]) -> int:
    """The tokens ``pack_shared_prefix`` would forward (its ``packed_tokens``), without building a tensor."""
    return sum(length for _, _, length in _row_plans(token_ids, groups))


def pack_shared_prefix(token_ids: Sequence[Sequence[int]], groups: Sequence[Any], device: Any = "cpu") -> PackedRows:
    """Pack the samples of a micro-batch, one row per run of same-group samples."""
    import torch

    if len(token_ids) != len(groups):
        raise ValueError(f"{len(token_ids)} samples but {len(groups)} group keys")
    if any(len(s) < 2 for s in token_ids):
        raise ValueError("every sample needs at least 2 tokens (one to predict)")
    plans = _row_plans(token_ids, groups)
    width = max(length for _, _, length in plans)
    ids = torch.zeros((len(plans), width), dtype=torch.long)
    pos = torch.zeros((len(plans), width), dtype=torch.long)
    logit_index = torch.zeros((len(token_ids), max(len(s) for s in token_ids) - 1), dtype=torch.long)
    sample_row = [0] * len(token_ids)
    rows = []
    for r, (prefix, conts, length) in enumerate(plans):
        ids[r, :prefix] = torch.tensor(token_ids[conts[0][0]][:prefix], dtype=torch.long)
        pos[r, :prefix] = torch.arange(prefix)
        spans = []
        for i, off in conts:
            seq = token_ids[i]
            c = len(seq) - prefix
            sample_row[i] = r
            if c:
                ids[r, off : off + c] = torch.tensor(seq[prefix:], dtype=torch.long)
                pos[r, off : off + c] = torch.arange(prefix, len(seq))
                spans.append((off, c))
            j = torch.arange(len(seq) - 1)
            logit_index[i, : len(seq) - 1] = torch.where(j < prefix, j, off + j - prefix)
        rows.append(_row_layout(prefix, length, spans, device))
    return PackedRows(ids.to(device), pos.to(device), rows, sample_row, logit_index.to(device))


def _row_layout(prefix: int, length: int, spans: list[tuple[int, int]], device: Any) -> RowLayout:
    """The side-by-side layout of a row's continuations (``spans``: (offset, length) each)."""
    import torch

    if not spans:
        return RowLayout(prefix, length)
    widest = max(c for _, c in spans)
    index = torch.zeros((len(spans), widest), dtype=torch.long)
    mask = torch.zeros((len(spans), 1, widest, prefix + widest), dtype=torch.bool)
    valid = torch.zeros((len(spans), widest), dtype=torch.bool)
    mask[:, :, :, :prefix] = True
    for n, (off, c) in enumerate(spans):
        index[n, :c] = torch.arange(off, off + c)
        index[n, c:] = off  # padding queries and keys: never read, never attended to
        mask[n, 0, :c, prefix : prefix + c] = torch.ones((c, c), dtype=torch.bool).tril()
        mask[n, 0, c:, prefix] = True  # a padding query attends somewhere: no all-masked row (NaN)
        valid[n, :c] = True
    return RowLayout(prefix, length, index.to(device), mask.to(device), valid.flatten().nonzero().squeeze(1).to(device))


def shared_prefix_attention(
    module: Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
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
        if row.continuation_index is not None:
            parts.append(_continuations(module, q[0], k[0], v[0], row, dropout, scaling, kwargs))
        if width > row.length:  # padding of a shorter row: never read
            parts.append(query.new_zeros((1, width - row.length, query.shape[1], query.shape[3])))
        outputs.append(torch.cat(parts, dim=1))
    return torch.cat(outputs, dim=0), None


def _continuations(
    module: Module,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row: RowLayout,
    dropout: float,
    scaling: float | None,
    kwargs: dict[str, Any],
) -> Any:
    """The continuations' attention outputs [length - prefix, H, D] in row order, from one row's
    q [H, W, D] and k/v [KVH, W, D]: each continuation's queries against the prefix and itself."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    index = row.continuation_index  # [n, c]
    n = index.shape[0]
    if q.device.type == "cpu" and row.prefix and not dropout:
        return _split_continuations(q, k, v, row, scaling)

    def side_by_side(x):  # [H, W, D] -> [n, H, c, D]
        return x[:, index].transpose(0, 1)

    def with_prefix(x):  # [KVH, W, D] -> [n, KVH, prefix + c, D]
        own = side_by_side(x)
        shared = x[None, :, : row.prefix].expand(n, -1, -1, -1)
        return torch.cat([shared, own], dim=2)

    out, _ = sdpa_attention_forward(
        module,
        side_by_side(q),
        with_prefix(k),
        with_prefix(v),
        row.continuation_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=False,
        **kwargs,
    )  # [n, c, H, D]
    return out.reshape(-1, out.shape[2], out.shape[3])[row.continuation_valid][None]


def _split_continuations(q: Tensor, k: Tensor, v: Tensor, row: RowLayout, scaling: float | None) -> Any:
    """``_continuations`` on CPU: two unmasked flash blocks merged (learner/split_attention.py)."""
    import torch

    # SDPA runs in the autocast dtype under autocast (its kernels need one dtype); so does this.
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    repeat = q.shape[0] // k.shape[0]  # grouped-query attention: each key/value head serves `repeat` query heads
    if repeat > 1:
        k, v = k.repeat_interleave(repeat, dim=0), v.repeat_interleave(repeat, dim=0)
    index, prefix = row.continuation_index, row.prefix
    out = split_continuation_attention(
        q[None, :, prefix : row.length],
        k[None, :, :prefix],
        v[None, :, :prefix],
        q[:, index].transpose(0, 1),
        k[:, index].transpose(0, 1),
        v[:, index].transpose(0, 1),
        row.continuation_valid,
        scaling,
    )  # [1, H, C, D]
    return out.transpose(1, 2)


def use_shared_prefix_attention(model: Any) -> None:  # a transformers PreTrainedModel
    """Route ``model``'s attention through ``shared_prefix_attention`` (SDPA underneath)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, shared_prefix_attention)
    model.set_attn_implementation(ATTENTION)
