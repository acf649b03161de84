"""learner/packing.py: shared-prefix rows give every token the context it had unpacked."""

from __future__ import annotations

import random

import pytest
import torch

from learner.packing import (
    common_prefix_length,
    pack_shared_prefix,
    packed_length,
    row_groups,
    use_shared_prefix_attention,
)


def test_common_prefix_and_rows():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 6], [5, 6]]) == 2
    assert common_prefix_length([[1], [2]]) == 0
    assert row_groups(["a", "a", "b", "a"]) == [[0, 1], [2], [3]]


def test_layout_positions_mask_and_logit_index():
    seqs = [[7, 8, 9, 1, 2], [7, 8, 9, 3], [4, 5, 6]]
    p = pack_shared_prefix(seqs, ["g", "g", "h"])
    # row 0: prefix 7 8 9 | 1 2 | 3 ; row 1: 4 5 6 (a lone sample is all prefix), padded to width 6
    assert p.input_ids.tolist() == [[7, 8, 9, 1, 2, 3], [4, 5, 6, 0, 0, 0]]
    assert p.position_ids.tolist()[0] == [0, 1, 2, 3, 4, 3]
    assert [(r.prefix, r.length) for r in p.rows] == [(3, 6), (3, 3)] and p.packed_tokens == 9
    assert packed_length(seqs, ["g", "g", "h"]) == 9  # the count the ranks agree on, without the tensors
    assert p.sample_row == [0, 0, 1]
    # the logits predicting token j + 1 of each sample
    assert p.logit_index.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 0]]
    # continuations side by side (packed 3 4 | 5 (padded)): each query sees the prefix and its own
    # earlier tokens; keys are [prefix 0 1 2 | own 0 1]; the padding query attends to one key only
    row = p.rows[0]
    assert row.continuation_index.tolist() == [[3, 4], [5, 5]]
    assert row.continuation_mask[:, 0].tolist() == [
        [[True, True, True, True, False], [True, True, True, True, True]],
        [[True, True, True, True, False], [True, True, True, True, False]],
    ]
    assert row.continuation_valid.tolist() == [0, 1, 2]  # flat [n * c]: 3 real queries, in row order
    assert p.rows[1].continuation_index is None  # a lone sample: all prefix


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="group keys"):
        pack_shared_prefix([[1, 2]], ["a", "b"])
    with pytest.raises(ValueError, match="at least 2 tokens"):
        pack_shared_prefix([[1]], ["a"])


def _tiny():
    from transformers import AutoModelForCausalLM

    from weights.model_assets import prepare_tiny_model

    return AutoModelForCausalLM.from_pretrained(
        str(prepare_tiny_model()), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def _unpacked_logprobs(model, seqs, mask):
    out = torch.zeros(mask.shape)
    for i, s in enumerate(seqs):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(s[1:])[:, None])[:, 0]
        out[i, : len(s) - 1] = lp * mask[i, : len(s) - 1]
    return out


def _batch():
    rng = random.Random(0)
    prompt = [rng.randrange(100, 5000) for _ in range(40)]
    seqs = [prompt + [rng.randrange(100, 5000) for _ in range(rng.randint(5, 20))] for _ in range(3)]
    seqs.append(prompt[:30] + [11, 12, 13])  # diverges inside the prompt
    seqs.append([rng.randrange(100, 5000) for _ in range(25)])  # another group, alone in its row
    seqs += [[1, 2, 3, 4], [9, 8, 7, 6, 5]]  # a group whose rollouts share nothing: no prefix at all
    groups = ["a", "a", "a", "a", "b", "c", "c"]
    width = max(map(len, seqs))
    mask = torch.zeros((len(seqs), width - 1))
    targets = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        mask[i, 2 : len(s) - 1] = 1.0  # scored: inside the shared prompt too, and every continuation
        targets[i, : len(s)] = torch.tensor(s)
    return seqs, groups, mask, targets


def test_packed_logprobs_equal_the_unpacked_ones():
    model = _tiny()
    seqs, groups, mask, targets = _batch()
    expected = _unpacked_logprobs(model, seqs, mask)
    use_shared_prefix_attention(model)
    packed = pack_shared_prefix(seqs, groups)
    assert [r.prefix for r in packed.rows] == [30, 25, 0] and packed.packed_tokens < sum(map(len, seqs))
    with torch.no_grad():
        logits = model(**packed.forward_kwargs()).logits.float()  # [R, W, V]
    rows = torch.tensor(packed.sample_row)[:, None].expand_as(packed.logit_index)
    logp_all = torch.log_softmax(logits[rows, packed.logit_index], -1)  # [B, T, V]
    logp = logp_all.gather(-1, targets[:, 1:, None])[..., 0] * mask
    assert torch.allclose(logp, expected, atol=2e-5), (logp - expected).abs().max()
    # Unpacked inputs through the same attention function: plain causal attention.
    with torch.no_grad():
        again = model(input_ids=torch.tensor([seqs[0]])).logits[0].float()
    lp = torch.log_softmax(again[:-1], -1).gather(-1, torch.tensor(seqs[0][1:])[:, None])[:, 0]
    assert torch.allclose(lp[2:], expected[0, 2 : len(seqs[0]) - 1], atol=2e-5)


def _packed_and_unpacked_grads(model, seqs, groups, mask):
    """Gradients of the sum of scored log p, packed (the model's packed attention) and unpacked."""

    def grads():
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out

    total = 0.0
    for i, s in enumerate(seqs):
        logits = model(input_ids=torch.tensor([s])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(s[1:])[:, None])[:, 0]
        total = total + (lp * mask[i, : len(s) - 1]).sum()
    total.backward()
    unpacked = grads()
    packed = pack_shared_prefix(seqs, groups)
    logits = model(**packed.forward_kwargs()).logits.float()
    rows = torch.tensor(packed.sample_row)[:, None].expand_as(packed.logit_index)
    targets = torch.zeros(packed.logit_index.shape, dtype=torch.long)
    for i, s in enumerate(seqs):
        targets[i, : len(s) - 1] = torch.tensor(s[1:])
    lp = torch.log_softmax(logits[rows, packed.logit_index], -1).gather(-1, targets[..., None])[..., 0]
    (lp * mask).sum().backward()
    return unpacked, grads()


def test_packed_gradients_equal_the_unpacked_ones():
    """The CPU split-attention path (rows with a prefix) and the masked path (a row without one)."""
    model = _tiny().train()
    use_shared_prefix_attention(model)
    seqs, groups, mask, _ = _batch()
    unpacked, packed = _packed_and_unpacked_grads(model, seqs, groups, mask)
    assert unpacked.keys() == packed.keys()
    for name in unpacked:
        assert torch.allclose(packed[name], unpacked[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_split_attention_equals_one_masked_call(dtype, atol):
    """Outputs and gradients of the merged two-block attention against SDPA with the full mask."""
    from learner.split_attention import split_continuation_attention

    g = torch.Generator().manual_seed(0)
    heads, dim, prefix, lengths = 4, 16, 11, [5, 9, 1]
    width, total = max(lengths), sum(lengths)
    q = torch.randn(heads, prefix + total, dim, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(heads, prefix + total, dim, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(heads, prefix + total, dim, generator=g, dtype=dtype).requires_grad_()
    mask = torch.zeros(total, prefix + total, dtype=torch.bool)
    mask[:, :prefix] = True
    index = torch.zeros(len(lengths), width, dtype=torch.long)
    valid, off = [], prefix
    for n, c in enumerate(lengths):
        mask[off - prefix : off - prefix + c, off : off + c] = torch.ones(c, c, dtype=torch.bool).tril()
        index[n, :c], index[n, c:] = torch.arange(off, off + c), off
        valid += [n * width + j for j in range(c)]
        off += c
    want = torch.nn.functional.scaled_dot_product_attention(
        q[None, :, prefix:], k[None], v[None], attn_mask=mask[None, None]
    )
    up = torch.randn(want.shape, generator=g, dtype=dtype)
    want_grads = torch.autograd.grad((want * up).sum(), (q, k, v))
    got = split_continuation_attention(
        q[None, :, prefix:],
        k[None, :, :prefix],
        v[None, :, :prefix],
        q[:, index].transpose(0, 1),
        k[:, index].transpose(0, 1),
        v[:, index].transpose(0, 1),
        torch.tensor(valid),
        None,
    )
    got_grads = torch.autograd.grad((got * up).sum(), (q, k, v))
    assert torch.allclose(got.float(), want.float(), atol=atol), (got - want).abs().max()
    for a, b, name in zip(got_grads, want_grads, "qkv"):
        assert torch.allclose(a.float(), b.float(), atol=atol * 4), (name, (a - b).abs().max())
