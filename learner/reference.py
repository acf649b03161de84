"""The KL reference: the frozen initial weights, forwarded without a graph (under LoRA: the base, adapter off)."""

from __future__ import annotations

from typing import Any

from learner.ds_config import reference_config
from learner.lora import AdapterOffReference, lora_on
from learner.packing import use_shared_prefix_attention


def build_reference(model_path: str, cfg: Any, dtype: str, device: Any, hf_ds_config: Any, policy: Any = None) -> Any:
    """The reference model for a learner with settings ``cfg`` (a LearnerConfig) computing in ``dtype``.

    Under LoRA (``cfg.lora``) it is ``policy`` (the peft-wrapped policy) with its adapter disabled:
    the frozen base weights are the initial policy, so nothing is loaded (learner/lora.py).

    Under ZeRO-3 (``hf_ds_config`` alive) it is partitioned like the policy (loaded while the policy's
    HfDeepSpeedConfig is alive, then a DeepSpeed engine without optimizer, as OpenRLHF does): no rank
    holds a full copy. Otherwise a plain module, whose matmul weights are stored in bf16 when the
    learner computes in bf16 (``bf16_matmul_weights``)."""
    import torch
    from transformers import AutoModelForCausalLM

    if lora_on(cfg):
        return AdapterOffReference(policy)
    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    for p in ref.parameters():
        p.requires_grad_(False)
    if cfg.shared_prefix:
        use_shared_prefix_attention(ref)
    if hf_ds_config is None:
        ref = ref.to(device).eval()
        if dtype == "bfloat16":
            bf16_matmul_weights(ref)
        return ref
    import deepspeed

    engine, *_ = deepspeed.initialize(model=ref, config=reference_config(cfg, dtype))
    engine.module.eval()
    return engine


def bf16_matmul_weights(model: Any) -> None:
    """Store the weights (and biases) of ``model``'s Linear layers in bf16, the output head untied
    from the embedding, so a forward under bf16 autocast casts no weight: autocast would round the
    same fp32 values to the same bf16 ones at every forward. Norms and the embedding stay fp32 (their
    ops run in fp32 under autocast), so the forward computes exactly what it did with fp32 weights."""
    import torch

    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.to(torch.bfloat16)
