"""learner/packing.py: shared-prefix rows give every token the context it had unpacked."""

from __future__ import annotations

import random

import pytest
import torch

from learner.packing import (
    common_prefix_length,
    needed_positions,
    pack_shared_prefix,
    packed_token_logprobs,
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
    assert p.sample_row == [0, 0, 1]
    # the logits predicting token j + 1 of each sample
    assert p.logit_index.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1, 0, 0]]
    # continuation queries (packed 3, 4, 5): the prefix, then their own earlier tokens only
    assert p.rows[0].continuation_mask.tolist() == [
        [True, True, True, True, False, False],
        [True, True, True, True, True, False],
        [True, True, True, False, False, True],
    ]
    assert p.rows[1].continuation_mask.shape == (0, 3)


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
    kept = needed_positions(packed, mask)
    with torch.no_grad():
        logits = model(**packed.forward_kwargs(), logits_to_keep=kept).logits.float()
    logp, entropy = packed_token_logprobs(logits, kept, packed, targets[:, 1:], mask, with_entropy=True)
    assert torch.allclose(logp, expected, atol=2e-5), (logp - expected).abs().max()
    assert bool((entropy[mask.bool()] > 0).all()) and bool((entropy[~mask.bool()] == 0).all())
    # Unpacked inputs through the same attention function: plain causal attention.
    with torch.no_grad():
        again = model(input_ids=torch.tensor([seqs[0]])).logits[0].float()
    lp = torch.log_softmax(again[:-1], -1).gather(-1, torch.tensor(seqs[0][1:])[:, None])[:, 0]
    assert torch.allclose(lp[2:], expected[0, 2 : len(seqs[0]) - 1], atol=2e-5)
