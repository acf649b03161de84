"""The continuations' attention of a packed row as two unmasked blocks, merged: the CPU fast path.

Each continuation token attends to the shared prefix and to its own earlier tokens. As one masked
SDPA call (learner/packing.py's general path) the CPU flash kernel pays for the mask and for every
padded block; here the same attention is two calls with no mask at all: every continuation query
against the prefix's keys (dense), and each continuation against itself (causal, the
continuations side by side, right-padded: causality keeps real queries off the padding). The two
partial outputs are merged by their log-sum-exps, as ring and split-KV attention do:

    lse = logaddexp(lse_1, lse_2),  out = exp(lse_1 - lse) out_1 + exp(lse_2 - lse) out_2

and the backward runs the flash backward of each block with the merged output and log-sum-exp,
which gives each block's exact gradient (dS = P * (dP - rowsum(dO * O)) with P and O the merged
ones). Same numbers as the masked call up to float summation order; tests hold it to that.
"""

from __future__ import annotations

from typing import Any


def _flash(q, k, v, causal: bool, scale: float | None):
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _flash_backward(grad, q, k, v, out, lse, causal: bool, scale: float | None):
    import torch

    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, causal, scale=scale
    )


def _function():
    import torch

    class SplitContinuationAttention(torch.autograd.Function):
        """(q1 [1, H, C, D], k1/v1 [1, H, P, D], q2 [n, H, c, D], k2/v2 [n, H, c, D], valid [C]) ->
        out [1, H, C, D]: q1 are the C continuation queries in row order, q2 the same queries side by
        side (``valid``: their flat indices in [n * c])."""

        @staticmethod
        def forward(ctx, q1, k1, v1, q2, k2, v2, valid, scale):
            n, heads, width, dim = q2.shape
            o1, l1 = _flash(q1, k1, v1, False, scale)
            o2, l2 = _flash(q2, k2, v2, True, scale)
            o2_rows = o2.transpose(0, 1).reshape(heads, n * width, dim)[:, valid][None]
            l2_rows = l2.transpose(0, 1).reshape(heads, n * width)[:, valid][None]
            lse = torch.logaddexp(l1, l2_rows)
            out = (
                torch.exp(l1 - lse)[..., None] * o1.float() + torch.exp(l2_rows - lse)[..., None] * o2_rows.float()
            ).to(q1.dtype)
            ctx.save_for_backward(q1, k1, v1, q2, k2, v2, valid, out, lse, l2)
            ctx.scale = scale
            return out

        @staticmethod
        def backward(ctx, grad):
            q1, k1, v1, q2, k2, v2, valid, out, lse, l2 = ctx.saved_tensors
            grad = grad.contiguous()
            dq1, dk1, dv1 = _flash_backward(grad, q1, k1, v1, out, lse, False, ctx.scale)
            n, heads, width, dim = q2.shape

            def side_by_side(x, fill):  # [1, H, C, ...] -> [n, H, c, ...]; padding rows get ``fill``
                flat = fill.transpose(0, 1).reshape(heads, n * width, *x.shape[3:]).clone()
                flat[:, valid] = x[0]
                return flat.reshape(heads, n, width, *x.shape[3:]).transpose(0, 1).contiguous()

            zeros = torch.zeros_like(q2)
            # Padding queries: zero gradient and output, their own log-sum-exp (finite): no contribution.
            dq2, dk2, dv2 = _flash_backward(
                side_by_side(grad, zeros), q2, k2, v2, side_by_side(out, zeros), side_by_side(lse, l2), True, ctx.scale
            )
            return dq1, dk1, dv1, dq2, dk2, dv2, None, None

    return SplitContinuationAttention


_FUNCTION: Any = None


def split_continuation_attention(q1, k1, v1, q2, k2, v2, valid, scale: float | None) -> Any:
    """See ``SplitContinuationAttention``; k/v must have as many heads as q (repeat GQA's first)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _function()
    return _FUNCTION.apply(q1, k1, v1, q2, k2, v2, valid, scale)
