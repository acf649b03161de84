"""`seal plan` counts the keys and values the packed continuations' masked attention makes on a GPU
(issue 46 item 9; seal/estimate/memory.py ``packed_kv_bytes``): measured here with torch's profiler on
the same code path, learner/packing.py's masked ``_continuations``, which CUDA takes (CPU takes the two
unmasked blocks: dropout sends CPU down the masked path for this measurement, without changing a
byte of the copies). The prefix is copied beside each continuation (a cat per k and v), then
transformers' SDPA repeats both to every query head because a mask is given (``repeat_kv``)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

from learner.packing import _continuations, pack_shared_prefix
from seal.estimate.memory import LearnerSetup, ModelSpec, packed_kv_bytes

HEADS, KV_HEADS, HEAD_DIM, PREFIX, CONTINUATION, N = 8, 2, 8, 24, 5, 3


def test_the_plan_counts_the_keys_and_values_the_masked_path_allocates():
    config = LlamaConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        vocab_size=100,
    )
    attention = LlamaAttention(config, layer_idx=0)
    samples = [list(range(PREFIX)) + [50 + 7 * i + j for j in range(CONTINUATION)] for i in range(N)]
    row = pack_shared_prefix(samples, [0] * N).rows[0]
    q = torch.randn(HEADS, row.length, HEAD_DIM)
    k, v = torch.randn(KV_HEADS, row.length, HEAD_DIM), torch.randn(KV_HEADS, row.length, HEAD_DIM)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=True) as prof:
        _continuations(attention, q, k, v, row, 0.1, None, {})
    top = [e for e in prof.events() if e.cpu_parent is None]
    copies = sum(e.cpu_memory_usage for e in top if e.name == "aten::cat")  # the prefix beside each continuation
    repeats = sum(e.cpu_memory_usage for e in top if e.name == "aten::reshape" and len(e.input_shapes[0]) == 5)
    sdpa = next(e for e in top if e.name == "aten::scaled_dot_product_attention")
    assert sdpa.input_shapes[1] == [N, HEADS, PREFIX + CONTINUATION, HEAD_DIM]  # k at every query head

    spec = ModelSpec("probe", HEADS * HEAD_DIM, 1, HEADS, KV_HEADS, HEAD_DIM, 64, 100, False)
    setup = LearnerSetup(
        device="cuda",
        dtype="float32",
        shared_prefix=True,
        micro_batch_size=N,
        seq_len=PREFIX + CONTINUATION,
        response_len=CONTINUATION,
    )
    layer, kept = packed_kv_bytes(spec, setup)
    assert copies == 2 * N * KV_HEADS * (PREFIX + CONTINUATION) * HEAD_DIM * 4 > 0
    assert repeats == 2 * N * HEADS * (PREFIX + CONTINUATION) * HEAD_DIM * 4
    assert (layer, kept) == (copies + repeats, repeats)
    # CPU's two unmasked blocks make neither; neither does an unpacked micro-batch.
    assert packed_kv_bytes(spec, LearnerSetup(device="cpu", shared_prefix=True, micro_batch_size=N)) == (0.0, 0.0)
    assert packed_kv_bytes(spec, LearnerSetup(device="cuda", micro_batch_size=N)) == (0.0, 0.0)
