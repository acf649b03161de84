"""learner.cfg.lora on the tiny model: only the adapter trains, the base stays, the reference is the
base with the adapter off, checkpoints resume exactly (torch and DeepSpeed ZeRO-2)."""

from __future__ import annotations

import pytest
import torch

from env_pool.tags import RELEASED_BASE_WEIGHTS
from learner.engine import Learner, LearnerConfig
from learner.lora import LoraConfig
from learner.loss import LossConfig
from tests.integration.test_learner_engine import GROUPS, N, make_batch

RANK = 8
BACKENDS = [("torch", 0), ("deepspeed", 2)]


@pytest.fixture(scope="module")
def tiny_path():
    from weights.model_assets import prepare_tiny_model

    return str(prepare_tiny_model())


def lora_learner(tiny_path, backend="torch", stage=0, rank=RANK, packed=False):
    cfg = LearnerConfig(
        backend=backend,
        zero_stage=stage,
        lr=1e-2,
        weight_decay=0.0,
        mini_batch_groups=GROUPS,
        micro_batch_size=N if packed else 1,
        shared_prefix=packed,
        gradient_checkpointing=packed,
        loss=LossConfig(kl_coef=0.1),
        dtype="float32",
        lora=LoraConfig(rank=rank, alpha=16),
    )
    return Learner(tiny_path, cfg, group_size=N, world_size=1, timeout_s=600.0, step_timeout_s=3600.0)


def base_model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


def expected_adapter_size(tiny_path, rank):
    """rank x (in + out) per Linear of the base model but its output head: LoRA's A [r, in] and B [out, r]."""
    model = base_model(tiny_path)
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    assert linears
    return sum(rank * (m.in_features + m.out_features) for m in linears)


def split_state(lrn):
    """(base tensors, adapter tensors) of the learner's policy by name, copied."""
    state = {k: v.detach().clone() for k, v in lrn.model.state_dict().items()}
    adapter = {k: v for k, v in state.items() if "lora_" in k}
    return {k: v for k, v in state.items() if k not in adapter}, adapter


def optimizer_parameters(lrn):
    opt = getattr(lrn.optimizer, "optimizer", lrn.optimizer)  # DeepSpeed's wrapper, if any
    return [p for g in opt.param_groups for p in g["params"]]


@pytest.mark.parametrize("backend, stage, packed", [*[(b, s, False) for b, s in BACKENDS], ("deepspeed", 2, True)])
def test_only_the_adapter_trains_and_the_base_stays(tiny_path, backend, stage, packed):
    """packed: shared-prefix packing and gradient checkpointing on the peft-wrapped policy too."""
    lrn = lora_learner(tiny_path, backend, stage, packed=packed)
    expected = expected_adapter_size(tiny_path, RANK)
    trainable = [p for p in lrn.model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == expected
    assert sum(p.numel() for p in optimizer_parameters(lrn)) == expected  # no optimizer state for the base
    base0, adapter0 = split_state(lrn)

    lrn.train_batch(make_batch(0, tiny_path, shared_prompt=packed), RELEASED_BASE_WEIGHTS)
    assert lrn.model.is_gradient_checkpointing is packed
    base1, adapter1 = split_state(lrn)
    assert base1.keys() == base0.keys() and all(torch.equal(base1[k], base0[k]) for k in base0)
    moved = [k for k in adapter0 if not torch.equal(adapter1[k], adapter0[k])]
    assert any("lora_B" in k for k in moved), "the adapter did not move"
    assert all(p.grad is None for p in lrn.model.parameters() if not p.requires_grad)


def test_the_reference_is_the_base_model_with_the_adapter_off(tiny_path):
    """After a step the adapter changes the policy's logits; the reference (adapter disabled) still
    computes exactly what the base model loaded on its own does, and no second model is held."""
    lrn = lora_learner(tiny_path)
    lrn.train_batch(make_batch(1, tiny_path), RELEASED_BASE_WEIGHTS)
    ids = torch.tensor([[5, 900, 47, 3000, 12, 801, 77]])
    with torch.no_grad():
        ref = lrn.ref(input_ids=ids).logits
        policy = lrn.model(input_ids=ids).logits
        base = base_model(tiny_path)(input_ids=ids).logits
    assert lrn.ref.module is lrn.model
    assert torch.allclose(ref, base, atol=1e-6, rtol=0), float((ref - base).abs().max())
    assert not torch.allclose(policy, base, atol=1e-4, rtol=0), "the adapter changed nothing"
    # and the adapter is back on after the reference's forward
    with torch.no_grad():
        assert torch.equal(lrn.model(input_ids=ids).logits, policy)


@pytest.mark.parametrize("backend, stage", BACKENDS)
def test_lora_checkpoint_holds_the_adapter_and_resumes_exactly(tiny_path, tmp_path, backend, stage):
    b1, b2 = make_batch(2, tiny_path), make_batch(3, tiny_path)
    first = lora_learner(tiny_path, backend, stage)
    first.train_batch(b1, RELEASED_BASE_WEIGHTS)
    first.save_checkpoint(tmp_path / "ckpt", extra={"interface": {"version": 2}})
    first.train_batch(b2, RELEASED_BASE_WEIGHTS)
    expected = first.model.state_dict()

    files = [f for f in (tmp_path / "ckpt").rglob("*") if f.is_file()]
    saved = sum(f.stat().st_size for f in files)
    base_bytes = sum(t.numel() * 4 for t in base_model(tiny_path).state_dict().values())
    assert saved < base_bytes, f"the checkpoint ({saved} B) holds the base weights ({base_bytes} B)"

    resumed = lora_learner(tiny_path, backend, stage)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"interface": {"version": 2}} and resumed.step == 1
    resumed.train_batch(b2, RELEASED_BASE_WEIGHTS)
    got = resumed.model.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)

    other_rank = lora_learner(tiny_path, backend, stage, rank=4)
    with pytest.raises(ValueError, match="LoRA rank 8"):
        other_rank.load_checkpoint(tmp_path / "ckpt")


def test_lora_settings_are_checked():
    with pytest.raises(ValueError, match="dropout must be 0"):
        LoraConfig(rank=8, dropout=0.05)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="lm_head, which generators serving adapters leave out"):
        LoraConfig(rank=8, target_modules=["q_proj", "lm_head"])
    assert LoraConfig(rank=8, target_modules=["q_proj", "lm_head"], publish="merged").rank == 8  # whole weights
    assert LearnerConfig(backend="deepspeed", zero_stage=3, lora=LoraConfig(rank=8)).lora.rank == 8  # ZeRO-3 too
    assert LearnerConfig(lora=LoraConfig(rank=None)).lora is not None  # rank null: full training


def test_weights_out_of_a_lora_learner_are_the_base_with_the_adapter_merged(tiny_path, tmp_path):
    """Whole-model publishes and snapshots (what `seal train` sends and the evaluators load): the base's
    names and layout, holding W + scaling x B A, so a plain model loaded from them is the policy."""
    from transformers import AutoModelForCausalLM

    lrn = lora_learner(tiny_path)
    lrn.train_batch(make_batch(4, tiny_path), RELEASED_BASE_WEIGHTS)
    path, _ = lrn.weights_out.save_snapshot(tmp_path, 1, lrn.step)
    snapshot = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 900, 47, 3000, 12, 801, 77]])
    with torch.no_grad():
        policy, served = lrn.model(input_ids=ids).logits, snapshot(input_ids=ids).logits
        base = base_model(tiny_path)(input_ids=ids).logits
    assert torch.allclose(served, policy, atol=1e-5, rtol=0), float((served - policy).abs().max())
    assert not torch.allclose(served, base, atol=1e-4, rtol=0)

    sent = lrn.weights_out.generator_weights()
    plain = base_model(tiny_path)
    assert sent.keys() == {n for n, _ in plain.named_parameters()}  # a tied head once, as for full training
    assert all(torch.equal(sent[k], v) for k, v in snapshot.state_dict().items() if k in sent)
    # What publishes send (publish: adapter, the default, or merged): tests/integration/test_lora_publish_paths.py.


def carrying_reference(trajectories, tiny_path, shift=0.0):
    """The trajectories as trainer.reference_logprobs=generator delivers them: each with the base
    model's log-prob of its generated tokens (here from the base model in torch, fp32)."""
    from dataclasses import replace

    from tests.integration.hf_logprobs import sequence_logprobs

    base = base_model(tiny_path)
    out = []
    for t in trajectories:
        lps = sequence_logprobs(base, t.token_ids)
        out.append(replace(t, reference_logprobs=[lp + shift if m else 0.0 for lp, m in zip(lps, t.loss_mask)]))
    return out


@pytest.mark.parametrize("backend, stage, packed", [("torch", 0, False), ("deepspeed", 2, True)])
def test_a_carried_reference_replaces_the_reference_forward(tiny_path, backend, stage, packed):
    """Given the base model's log-probs with the trajectories, the learner skips its reference forward
    and takes the same step: the same KL and loss, the same adapter after it (fp32, packed or not).
    A reference off by 1 nat moves the KL: the carried values are what the loss reads."""
    batch = make_batch(4, tiny_path, shared_prompt=packed)
    own, carried, shifted = (lora_learner(tiny_path, backend, stage, packed=packed) for _ in range(3))
    start = own.model.state_dict()
    for lrn in (carried, shifted):
        lrn.model.load_state_dict(start)

    a = own.train_batch(batch, RELEASED_BASE_WEIGHTS)
    b = carried.train_batch(carrying_reference(batch, tiny_path), RELEASED_BASE_WEIGHTS)
    c = shifted.train_batch(carrying_reference(batch, tiny_path, shift=-1.0), RELEASED_BASE_WEIGHTS)
    assert a.reference_carried_tokens == 0 and b.reference_carried_tokens == b.scored_tokens > 0
    assert a.kl is not None and b.kl == pytest.approx(a.kl, rel=1e-4, abs=1e-7)
    assert b.loss == pytest.approx(a.loss, rel=1e-4, abs=1e-7)
    _, adapter_a = split_state(own)
    _, adapter_b = split_state(carried)
    # The carried values come from an unpacked forward in torch, the learner's own from its (packed)
    # forward: fp32 rounding apart (1e-7 nats). Adam's first step divides each gradient by its own size,
    # which magnifies that where a gradient is near 0: measured 2e-7 unpacked, 2e-5 packed, against a
    # step of lr = 1e-2 per weight. 1e-4 is 1% of the step.
    assert all(torch.allclose(adapter_b[k], adapter_a[k], atol=1e-4, rtol=0) for k in adapter_a)
    assert c.kl > a.kl + 0.1  # k3 of a 1-nat gap is e^-1 + 1 - 1 = 0.37 per token


def test_a_batch_partly_without_it_forwards_those_micro_batches(tiny_path):
    """A trajectory the generator did not score (left to the learner) costs only its own micro-batch
    a reference forward; the rest still take theirs from the trajectories."""
    from dataclasses import replace

    batch = carrying_reference(make_batch(5, tiny_path), tiny_path)
    batch[0] = replace(batch[0], reference_logprobs=None)
    result = lora_learner(tiny_path).train_batch(batch, RELEASED_BASE_WEIGHTS)
    assert 0 < result.reference_carried_tokens == result.scored_tokens - sum(batch[0].loss_mask)
