"""`seal plan` under LoRA (learner.cfg.lora): the adapter's memory on the learner (gradients, optimizer
state and checkpoints for the adapter alone, no reference copy, a snapshot's merged model) and vLLM's
adapter slots on the generator, against hand-computed figures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from learner.lora import LoraConfig
from seal.config import config_dir
from seal.estimate.io_bounds import checkpoint_bytes
from seal.estimate.memory import GB, GeneratorSetup, LearnerSetup, ModelSpec, generator_memory, learner_memory
from seal.estimate.plan import with_adapter_slots

QWEN7 = ModelSpec.from_config(
    json.loads((config_dir() / "model_specs" / "qwen2.5-7b-instruct" / "config.json").read_text()), "qwen7"
)
# Rank 16 on every linear layer but the head, by hand: per layer q (3584 + 3584), k and v 2 x (3584 + 512),
# o (3584 + 3584), gate and up 2 x (3584 + 18944), down (18944 + 3584) = 90,112; x 28 layers x 16.
A7 = 16 * 28 * 90_112


def test_adapter_parameters_by_hand_and_as_peft_counts_them():
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.lora import add_adapter
    from weights.model_assets import prepare_tiny_model

    assert QWEN7.lora_params(16) == A7 == 40_370_176  # what peft prints for Qwen2.5-7B at r=16, all-linear
    tiny = prepare_tiny_model()
    spec = ModelSpec.from_config(json.loads((tiny / "config.json").read_text()), "tiny")
    model = add_adapter(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny)), LoraConfig(rank=8))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert spec.lora_params(8) == trainable


def test_a_lora_learner_holds_the_base_once_and_the_adapters_training_state():
    full = LearnerSetup(backend="torch", device="cuda", dtype="bfloat16", seq_len=8192, response_len=1024)
    lora = dataclasses.replace(full, lora_rank=16)
    f, e = learner_memory(QWEN7, full), learner_memory(QWEN7, lora)
    p = QWEN7.params()
    assert e.device["weights"] == f.device["weights"] == 4 * p  # the frozen base stays fp32, whole
    assert (e.device["adapter"], e.device["gradients"], e.device["optimizer"]) == (4 * A7, 4 * A7, 8 * A7)
    assert "reference" in f.device and "reference" not in e.device  # the base with the adapter off
    # A snapshot builds the merged model for the call, in host memory: one weight and its delta on the GPU.
    largest = max(QWEN7.embedding_params(), QWEN7.hidden * QWEN7.intermediate)
    assert e.phases["snapshot_merge"] == 8 * largest and e.host["merged_model"] == 4 * p
    assert f.device_bytes / GB > 80 > e.device_bytes / GB  # full training needs more than an 80 GB card
    assert checkpoint_bytes(QWEN7, lora) == 12 * A7  # the adapter and its AdamW m and v


def test_the_generator_counts_vllms_adapter_slots_out_of_its_kv_budget():
    plain = GeneratorSetup(device="cuda", dtype="bfloat16", max_model_len=8192, gpu_memory_utilization=0.5)
    slots = dataclasses.replace(plain, max_lora_rank=16, max_loras=2)
    a, b = generator_memory(QWEN7, plain, 80 * GB), generator_memory(QWEN7, slots, 80 * GB)
    assert a.adapters_per_gpu == 0 and b.adapters_per_gpu == 2 * A7 * 2  # two bf16 slots of rank 16
    assert a.kv_budget - b.kv_budget == pytest.approx(b.adapters_per_gpu)
    cpu = dataclasses.replace(slots, device="cpu", cpu_kv_cache_gb=2.0)
    assert generator_memory(QWEN7, cpu, None).replica_bytes - generator_memory(
        QWEN7, dataclasses.replace(cpu, max_lora_rank=0), None
    ).replica_bytes == pytest.approx(2 * A7 * 2)


@pytest.mark.parametrize(
    "lora, rank", [(None, 0), (LoraConfig(), 0), (LoraConfig(rank=4, publish="merged"), 0), (LoraConfig(rank=4), 8)]
)
def test_slots_only_where_the_learner_publishes_adapters(lora, rank):
    assert with_adapter_slots(GeneratorSetup(), lora).max_lora_rank == rank  # vLLM's smallest rank >= 4: 8


def test_the_replicas_scoring_the_reference_get_a_slot_for_the_zero_adapter():
    """trainer.reference_logprobs=generator: the engine's 2 slots and one for the base's zero adapter
    (actors/generation/adapters.py adapter_slots, as `seal train` starts the replicas); set by hand, as set."""
    lora = LoraConfig(rank=8)
    assert with_adapter_slots(GeneratorSetup(), lora).max_loras == 2
    assert with_adapter_slots(GeneratorSetup(), lora, reference_from_base=True).max_loras == 3
    assert with_adapter_slots(GeneratorSetup(), lora, reference_from_base=True, max_loras=5).max_loras == 5
    assert with_adapter_slots(GeneratorSetup(), None, reference_from_base=True).max_loras == 2  # no adapters


def test_zero3_partitions_the_adapter_and_a_snapshot_gathers_the_whole_model():
    two = LearnerSetup(backend="deepspeed", zero_stage=3, world_size=2, device="cuda", dtype="bfloat16", lora_rank=16)
    e, p = learner_memory(QWEN7, two), QWEN7.params()
    assert e.device["weights"] == 4 * p / 2 and e.device["adapter"] == 4 * A7 / 2  # both partitioned
    assert e.device["optimizer"] == 8 * A7 / 2
    # The merge reads the base whole: every rank gathers the model (learner/weights_out.py _out_model).
    largest = max(QWEN7.embedding_params(), QWEN7.hidden * QWEN7.intermediate)
    assert e.phases["snapshot_merge"] == 8 * largest + 4 * p
