"""learner/token_logprobs.py and learner/scoring_head.py: the chunked head computes what the
straightforward one does (values and gradients), without the full logits."""

from __future__ import annotations

import pytest
import torch

from learner.scoring_head import check_plain_head, scoring_head
from learner.token_logprobs import chunk_rows, chunked_token_logprobs, full_token_logprobs


def _inputs(n=37, d=16, v=101, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    return h, w, t


def _grads(fn, h, w, t, gl, ge):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    logp, ent = fn(h, w, t)
    ((logp * gl).sum() + (ent * ge).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("rows", [5, 37, 1])  # 8 chunks, the last short; one; a row each
def test_values_and_gradients_equal_the_full_logits_in_fp32(rows):
    h, w, t = _inputs()
    g = torch.Generator().manual_seed(1)
    gl, ge = torch.randn(37, generator=g), torch.randn(37, generator=g)
    mask = torch.rand(37, generator=g) > 0.3  # scored rows only get an upstream gradient
    gl, ge = gl * mask, ge * mask
    want = _grads(full_token_logprobs, h, w, t, gl, ge)
    got = _grads(lambda *a: chunked_token_logprobs(*a, rows=rows), h, w, t, gl, ge)
    for a, b, name in zip(got, want, ("logp", "entropy", "grad h", "grad w")):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, (a - b).abs().max())


def test_log_probability_gradient_alone_and_no_gradient_at_all():
    h, w, t = _inputs(n=9, v=50)
    want = _grads(full_token_logprobs, h, w, t, torch.ones(9), torch.zeros(9))
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    logp, _ = chunked_token_logprobs(h2, w2, t, rows=4)
    logp.sum().backward()  # the entropy output unused: its gradient never materialises
    assert torch.allclose(h2.grad, want[2], atol=1e-5) and torch.allclose(w2.grad, want[3], atol=1e-5)
    with torch.no_grad():
        logp, ent = chunked_token_logprobs(h, w, t)
    assert not logp.requires_grad and torch.allclose(logp, want[0], atol=1e-5)


def test_under_bf16_autocast_the_matmul_runs_in_bf16_like_a_linear_layer():
    h, w, t = _inputs(n=20, d=32, v=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = torch.nn.functional.linear(h, w)  # what lm_head gives under autocast
        got, ent = chunked_token_logprobs(h, w, t, rows=7)
    want = torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0]
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-4)
    got.sum().backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_empty_input_and_shape_errors():
    h, w, _ = _inputs(n=0)
    logp, ent = chunked_token_logprobs(h, w, torch.zeros(0, dtype=torch.long))
    assert logp.shape == (0,) and ent.shape == (0,)
    h, w, t = _inputs(n=4)
    with pytest.raises(ValueError, match="one target per row"):
        chunked_token_logprobs(h, w, t[:3])
    with pytest.raises(ValueError, match=r"hidden \[N, D\]"):
        chunked_token_logprobs(h, w[:, :5], t)
    assert chunk_rows(49152) == 85 and chunk_rows(152064) == 64 and chunk_rows(10**9, min_rows=1) == 1


def _tiny():
    from transformers import AutoModelForCausalLM

    from weights.model_assets import prepare_tiny_model

    return AutoModelForCausalLM.from_pretrained(str(prepare_tiny_model()), dtype=torch.float32).eval()


def test_the_scoring_head_scores_chosen_triples_of_a_real_model():
    model = _tiny()
    ids = torch.randint(5, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    keep = torch.tensor([3, 4, 9])
    rows, positions = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 0, 2, 1])  # into [R, K]
    targets = ids[rows, keep[positions] + 1]
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        want = torch.log_softmax(logits[rows, keep[positions]], -1).gather(1, targets[:, None])[:, 0]
        with scoring_head(model, rows, positions, targets):
            got = model(input_ids=ids, logits_to_keep=keep).logits
    assert got.shape == (4, 2) and torch.allclose(got[:, 0], want, atol=1e-5)
    assert not hasattr(model.get_output_embeddings(), "forward") or "forward" not in vars(model.lm_head)
    check_plain_head(model)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.config.vocab_size))
    with pytest.raises(ValueError, match="with a bias"):
        check_plain_head(model)


def test_without_entropy_the_log_probabilities_and_their_gradients_stay():
    h, w, t = _inputs(n=11, v=70)
    want = _grads(full_token_logprobs, h, w, t, torch.ones(11), torch.zeros(11))
    got = _grads(
        lambda *a: chunked_token_logprobs(*a, rows=3, with_entropy=False), h, w, t, torch.ones(11), torch.ones(11)
    )
    assert torch.equal(got[1], torch.zeros(11))  # no entropy, and its upstream gradient is ignored
    for a, b in zip((got[0], got[2], got[3]), (want[0], want[2], want[3])):
        assert torch.allclose(a, b, atol=1e-5)
