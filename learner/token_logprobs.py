"""Log-probabilities and entropy of chosen tokens straight from the final hidden states, in chunks.

The straightforward way, logits = lm_head(h) over the whole vocabulary at every scored position,
then log-softmax, holds a [scored tokens x vocabulary] fp32 tensor (and its softmax, and the bf16
logits under autocast) from the forward to the backward: for 900 scored tokens of a 49K-token
vocabulary that is 177 MB per copy; for a 7B model's 152K-token vocabulary and 8K scored tokens,
5 GB per copy. ``ChunkedTokenLogprobs`` computes the same values a chunk of rows at a time,
keeping only the per-row log-sum-exp, and recomputes each chunk's logits in the backward: one
more matmul of the head (2 N V D flops, a few percent of a step) buys the memory and the
elementwise passes over the full logits.

Numerics are those of the straightforward path: the head's matmul runs in the autocast dtype when
autocast is on (bf16: the logits are rounded to bf16 as ``lm_head`` under autocast gives them),
everything after it in fp32. Gradients flow to the hidden states and to the head's weight; the
entropy gets a gradient only when the loss has an entropy term (``entropy_grad``): logged as a
metric, its backward would run its passes over every chunk's logits for a zero gradient.

Chunk rows. Each chunk reads the whole head once in the forward and twice in the backward, so rows
per chunk set how often the head is read: on a GPU a chunk under 300 rows or so is bound by that
read, not by its flops (Qwen2.5's 152K x 3584 head is 1.09 GB in bf16; an H100 reads it in about
0.3 ms and multiplies it by 64 rows in 0.07). CPU chunks keep a 16 MB budget of fp32 logits (64
rows at least); CUDA chunks 256 MB (441 rows of a 152K vocabulary; the chunk's temporaries, ~14
bytes an entry, 0.94 GB), which `seal plan` counts. On CUDA the head's gradient is accumulated by
``torch.addmm(..., out_dtype=torch.float32)`` in place (bf16 operands, fp32 accumulator: no bf16
product of the whole head and no fp32 copy of it per chunk); torch 2.13 has it on CUDA only.
"""

from __future__ import annotations

from typing import Any

# Rows per chunk come from a budget for one chunk's fp32 logits (the module docstring), but never
# fewer than MIN_ROWS: a GPU's matmul wants 64 rows to fill its tiles.
CHUNK_BYTES = 16 * 2**20
CUDA_CHUNK_BYTES = 256 * 2**20
MIN_ROWS = 64


def chunk_rows(vocab: int, chunk_bytes: int | None = None, min_rows: int = MIN_ROWS, device_type: str = "cpu") -> int:
    """Rows per chunk for a ``vocab``-entry head: ``chunk_bytes`` of fp32 logits (default: the
    device's budget), at least ``min_rows``."""
    budget = chunk_bytes if chunk_bytes is not None else CUDA_CHUNK_BYTES if device_type == "cuda" else CHUNK_BYTES
    return max(min_rows, budget // (4 * vocab), 1)


_ADDMM_OUT_DTYPE = [True]  # False once torch refused it: some builds check self's dtype against mat2's


def _accumulate(grad_w: Any, g: Any, h: Any) -> None:
    """grad_w (fp32) += g.T @ h. On CUDA one in-place GEMM with an fp32 accumulator (bf16 operands
    allowed: ``out_dtype``, CUDA-only in torch 2.13); elsewhere the product, then its fp32 sum. PyTorch's
    ``_addmm_dtype_out_cuda`` has required ``self`` in mat2's dtype in some releases (a TORCH_CHECK,
    before anything is written): refused once, the old sum is used from then on."""
    import torch

    if grad_w.is_cuda and g.dtype != torch.float32 and _ADDMM_OUT_DTYPE[0]:
        try:
            torch.addmm(grad_w, g.T, h, out_dtype=torch.float32, out=grad_w)
            return
        except RuntimeError:
            _ADDMM_OUT_DTYPE[0] = False
    grad_w += (g.T @ h).float()


def _autocast_dtype(device_type: str) -> Any:
    import torch

    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _fn():
    import torch

    class ChunkedTokenLogprobs(torch.autograd.Function):
        """(hidden [N, D], weight [V, D], targets [N]) -> (log p(target) [N], entropy [N]), fp32."""

        @staticmethod
        def forward(ctx, hidden, weight, targets, compute_dtype, rows, with_entropy, entropy_grad):
            h = hidden.to(compute_dtype)
            w = weight.to(compute_dtype)
            n = h.shape[0]
            logp = torch.empty(n, dtype=torch.float32, device=h.device)
            entropy = torch.zeros(n, dtype=torch.float32, device=h.device)
            lse = torch.empty(n, dtype=torch.float32, device=h.device)
            with torch.autocast(h.device.type, enabled=False):
                for a in range(0, n, rows):
                    b = min(a + rows, n)
                    z = (h[a:b] @ w.T).float()  # [rows, V]
                    m = torch.logsumexp(z, dim=-1)
                    lse[a:b] = m
                    logp[a:b] = z.gather(1, targets[a:b, None]).squeeze(1) - m
                    if with_entropy:  # H = lse - sum_j p_j z_j
                        p = torch.exp(z - m[:, None])
                        entropy[a:b] = m - (p * z).sum(-1)
            ctx.save_for_backward(h, w, targets, lse, entropy)
            ctx.rows = rows
            ctx.with_entropy = with_entropy and entropy_grad  # a metric's entropy: no backward pass for it
            if not ctx.with_entropy:
                ctx.mark_non_differentiable(entropy)
            ctx.dtypes = (hidden.dtype, weight.dtype)
            ctx.set_materialize_grads(False)
            return logp, entropy

        @staticmethod
        def backward(ctx, grad_logp, grad_entropy):
            h, w, targets, lse, entropy = ctx.saved_tensors
            need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_h = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
            if not ctx.with_entropy:
                grad_entropy = None  # zeros, or a metric's: no gradient to carry
            if grad_logp is None and grad_entropy is None:
                return None, None, None, None, None, None, None
            with torch.autocast(h.device.type, enabled=False):
                for a in range(0, h.shape[0], ctx.rows):
                    b = min(a + ctx.rows, h.shape[0])
                    z = (h[a:b] @ w.T).float()
                    logp_all = z.sub_(lse[a:b, None])  # in place: z is not needed as such again
                    p = torch.exp(logp_all)
                    # d log p_t / d z_j = 1[j = t] - p_j;  d H / d z_j = -p_j (log p_j + H)
                    coef = -grad_logp[a:b, None].float() if grad_logp is not None else None
                    if grad_entropy is not None:
                        ge = grad_entropy[a:b, None].float()
                        g = p * (logp_all.add_(entropy[a:b, None]).mul_(-ge) + (coef if coef is not None else 0.0))
                    else:
                        assert coef is not None  # no entropy gradient: the logprob one is given (see above)
                        g = p.mul_(coef)  # in place: p is not needed again
                    if grad_logp is not None:
                        g.scatter_add_(1, targets[a:b, None], grad_logp[a:b, None].float())
                    g = g.to(h.dtype)
                    if grad_h is not None:  # need_h
                        grad_h[a:b] = (g @ w).float()
                    if grad_w is not None:  # need_w
                        _accumulate(grad_w, g, h[a:b])
            return (
                grad_h.to(ctx.dtypes[0]) if grad_h is not None else None,
                grad_w.to(ctx.dtypes[1]) if grad_w is not None else None,
                None,
                None,
                None,
                None,
                None,
            )

    return ChunkedTokenLogprobs


_FUNCTION: Any = None


def chunked_token_logprobs(
    hidden: Any,
    weight: Any,
    targets: Any,
    rows: int | None = None,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[Any, Any]:
    """log p(targets) and the entropy at each row of ``hidden`` [N, D] under the head ``weight`` [V, D]
    (logits = hidden @ weight.T, no bias): two fp32 [N] tensors, differentiable in hidden and weight.
    Under autocast the matmul runs in the autocast dtype, as ``nn.Linear`` would. ``rows`` per chunk:
    ``chunk_rows`` of the vocabulary on the hidden states' device by default. ``with_entropy=False``
    returns zeros for the entropy and skips its passes over the logits (the KL reference needs log p
    only); ``entropy_grad=False`` computes it but gives it no gradient (a metric: its backward passes
    are skipped)."""
    import torch

    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _fn()
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [N, D] and weight [V, D] expected, got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"one target per row expected: {tuple(targets.shape)} for {hidden.shape[0]} rows")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    dtype = _autocast_dtype(hidden.device.type) or torch.promote_types(hidden.dtype, weight.dtype)
    rows = rows or chunk_rows(weight.shape[0], device_type=hidden.device.type)
    return _FUNCTION.apply(hidden, weight, targets.long(), dtype, rows, with_entropy, entropy_grad)


def full_token_logprobs(
    hidden: Any, weight: Any, targets: Any, with_entropy: bool = True, entropy_grad: bool = True
) -> tuple[Any, Any]:
    """The straightforward computation ``chunked_token_logprobs`` replaces: full logits, then
    log-softmax and entropy in fp32 (the reference its tests hold it against)."""
    import torch

    logits = torch.nn.functional.linear(hidden, weight).float()
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(1, targets.long()[:, None]).squeeze(1)
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return picked, entropy
