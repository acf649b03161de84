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


def _profiled_backward(entropy_grad: bool, rows: int = 4):
    """A metric-mode step as the learner runs it: (log p, entropy) stacked, the entropy column detached,
    the loss on log p alone; the backward profiled. Returns (events, grad h, grad w)."""
    h, w, t = _inputs(n=12, v=90)
    logp, ent = chunked_token_logprobs(h, w, t, rows=rows, entropy_grad=entropy_grad)
    scored = torch.stack([logp, ent], dim=-1)
    loss = (scored[:, 0] * torch.linspace(-1, 1, 12)).sum() + 0.0 * scored[:, 1].detach().sum()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        loss.backward()
    return prof.events(), h.grad, w.grad


def test_a_metric_entropy_gets_no_backward_pass_and_the_gradients_stay():
    """Issue 46 item 6: logged as a metric the entropy still ran its backward branch on a zero gradient
    (torch.stack's backward gives the entropy column zeros): two more passes over every chunk's
    [rows x vocabulary] logits. With entropy_grad=False none runs and the gradients are the same."""

    def chunk_passes(events):  # in-place elementwise passes over a whole chunk of logits
        return sum(1 for e in events if e.name in ("aten::add_", "aten::mul_") and e.input_shapes[0] == [4, 90])

    metric, h_metric, w_metric = _profiled_backward(entropy_grad=False)
    graded, h_graded, w_graded = _profiled_backward(entropy_grad=True)
    assert chunk_passes(graded) == 2 * 3  # add_ (log p + H) and mul_ (x -ge) in each of the 3 chunks
    assert chunk_passes(metric) == 3  # only the log p branch's p.mul_(coef)
    assert torch.allclose(h_metric, h_graded, atol=1e-6) and torch.allclose(w_metric, w_graded, atol=1e-6)


def test_cuda_chunks_are_hundreds_of_rows_and_the_head_is_read_three_times_a_chunk():
    """Issue 46 item 6, the arithmetic. Every chunk reads the whole head once forward and twice backward
    (profiled below: per chunk h @ w.T in the forward, its recompute and g @ w in the backward) and adds
    a head-sized product, g.T @ h, to the fp32 head gradient. Qwen2.5-7B's head, V x D = 152064 x
    3584 (VD = 545M): the old accumulation ``grad_w += (g.T @ h).float()`` wrote and read a bf16 product
    (4 VD bytes), wrote and read its fp32 copy (8 VD) and read and wrote grad_w (8 VD), besides the three
    bf16 head reads (6 VD): 26 VD, 14.2 GB a chunk; at 64 rows a 2K-token trajectory is 32 chunks, 0.14 s
    at an H100's 3.35 TB/s. An in-place addmm with an fp32 accumulator reads and writes grad_w only (8 VD)
    and CUDA chunks of 256 MB of fp32 logits are 441 rows: 5 chunks of 14 VD, 0.011 s. Below ~300 rows
    (989 TFLOP/s over 3.35 TB/s) a chunk is bound by those bytes, not by its flops."""
    import math

    vocab, d = 152064, 3584
    vd = vocab * d
    assert chunk_rows(vocab) == 64 and chunk_rows(vocab, device_type="cuda") == 441 >= 989e12 / 3.35e12
    assert chunk_rows(49152, device_type="cuda") == 1365  # the embedded model's vocabulary

    def seconds(tokens: int, rows: int, bytes_per_chunk: float) -> float:
        return math.ceil(tokens / rows) * bytes_per_chunk / 3.35e12

    before, after = seconds(2048, 64, 26 * vd), seconds(2048, 441, 14 * vd)
    assert before == pytest.approx(0.136, abs=0.002) and after == pytest.approx(0.0114, abs=0.0005)
    assert before / after > 10
    h, w, t = _inputs(n=12, v=90)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        logp, _ = chunked_token_logprobs(h, w, t, rows=4, with_entropy=False)
        logp.sum().backward()
    shapes = [e.input_shapes for e in prof.events() if e.name == "aten::mm"]
    reads = [s for s in shapes if [90, 16] in s or [16, 90] in s]  # the head (or its transpose) an operand
    products = [s for s in shapes if s == [[90, 4], [4, 16]]]  # g.T @ h: a head-sized product to accumulate
    assert (len(reads), len(products), len(shapes)) == (3 * 3, 3, 4 * 3), shapes  # 3 chunks of 4 rows
