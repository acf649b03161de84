"""`seal plan`'s outputs: the readable table and the --json object (seal/estimate/plan.py builds the plan)."""

from __future__ import annotations

from typing import Any

from seal.estimate.memory import GB, micro_batch_tokens
from seal.estimate.plan_layout import describe_node
from seal.estimate.shared_gpus import describe

TERMS = {
    "weights": "weights (fp32)",
    "gradients": "gradients (fp32)",
    "master": "fp32 master partition",
    "optimizer": "optimizer state",
    "weight_casts": "bf16 weight casts (autocast)",
    "reference": "reference model (fp32)",
    "buffers": "ZeRO buffers",
    "activations": "activations",
    "prefix_mask": "shared-prefix mask",
    "prefix_kv": "shared-prefix keys/values",
    "logits": "logits (scored tokens)",
    "runtime": "runtime",
    "gathered": "ZeRO-3 gathered weights",
    "reference_casts": "reference bf16 cast (1 weight)",
    "weights_out": "weights out (rank 0)",
    "adapter": "LoRA adapter (fp32)",
    "merged_weights": "merged model (LoRA snapshot)",
    "merge_weight": "LoRA merge (1 weight, delta)",
    "merged_model": "merged model (LoRA snapshot)",
}
PHASES = {
    "policy_forward": "the policy's forward",
    "loss": "the loss (logits, entropy)",
    "reference_forward": "the reference's forward",
    "publish": "a weight gather (publish, generator copy)",
    "snapshot_merge": "a LoRA snapshot's merge",
}


def _label(term: str) -> str:
    base, _, rest = term.partition(" ")
    return TERMS.get(base, base) + (f" {rest}" if rest else "")


def plan_table(plan) -> str:
    m, ls, gs, ge = plan.model, plan.learner, plan.generator, plan.generator_est
    lines = [
        f"model: {m.name}, {m.params() / 1e9:.2f} B parameters ({m.layers} layers, hidden {m.hidden}, "
        f"{m.heads} heads / {m.kv_heads} KV, vocab {m.vocab}) from {plan.model_source}",
        f"hardware: {plan.hardware}",
        "",
    ]
    tokens, scored, packed = micro_batch_tokens(ls)
    lines.append(
        f"learner: {ls.describe()}; micro-batch {ls.micro_batch_size} x {ls.seq_len} tokens"
        + (f" packed to {tokens}" if packed else f" = {tokens}")
        + f" ({scored} scored)"
        + (", gradient checkpointing" if ls.gradient_checkpointing else ", no gradient checkpointing")
        + ("" if ls.reference else ", no reference model (KL 0)")
    )
    where = "GPU" if ls.device == "cuda" else "host"
    est = plan.learner_est
    lines.append(f"  {'per rank (' + where + ')':<34}{'GB':>8}   peak during {PHASES.get(est.phase, est.phase)}")
    for term, value in plan.learner_est.device.items():
        lines.append(f"  {_label(term):<34}{value / GB:>8.2f}")
    total = plan.learner_est.device_bytes / GB
    of = f"  of {plan.learner_capacity_gb:g} GB" if plan.learner_capacity_gb else ""
    lines.append(f"  {'total':<34}{total:>8.2f}{of}")
    if plan.learner_capacity_note:
        lines.append(f"  ({plan.learner_capacity_note})")
    for term, value in plan.learner_est.host.items():
        lines.append(f"  {'host: ' + _label(term):<34}{value / GB:>8.2f}")
    lines.append("")
    if gs.device == "cuda":
        lines.append(
            f"generator: {plan.replicas} replica{'s' * (plan.replicas > 1)} x TP {gs.tensor_parallel_size}, {gs.dtype}, cuda, "
            f"max_model_len {gs.max_model_len}, gpu_memory_utilization {gs.gpu_memory_utilization:g}"
        )
        lines.append(f"  {'weights per GPU':<34}{ge.weights_per_gpu / GB:>8.2f} GB")
        lines += _adapter_lines(gs, ge, " per GPU")
        lines.append(f"  {'KV cache per token per GPU':<34}{ge.kv_per_token / 1e3:>8.1f} KB")
        lines.append(f"  {'KV budget per GPU':<34}{ge.kv_budget / GB:>8.2f} GB")
        lines.append(f"  {'sequences of max_model_len':<34}{ge.sequences:>8d} concurrent per replica")
        lines.append(f"  {'reserved per replica':<34}{ge.replica_bytes / GB:>8.2f} GB ({ge.tp} GPU{'s' * (ge.tp > 1)})")
    else:
        lines.append(
            f"generator: {plan.replicas} replica{'s' * (plan.replicas > 1)}, {gs.dtype}, cpu, max_model_len {gs.max_model_len}"
        )
        lines.append(f"  {'weights':<34}{ge.weights_per_gpu / GB:>8.2f} GB")
        lines += _adapter_lines(gs, ge, "")
        lines.append(f"  {'KV cache per token':<34}{ge.kv_per_token / 1e3:>8.1f} KB")
        lines.append(f"  {'KV cache (cpu_kv_cache_gb)':<34}{ge.kv_budget / GB:>8.2f} GB")
        lines.append(f"  {'sequences of max_model_len':<34}{ge.sequences:>8d} concurrent")
        lines.append(f"  {'host memory per replica':<34}{ge.replica_bytes / GB:>8.2f} GB")
    lines.append("")
    if plan.io is not None:  # what the driver waits for these calls on every rank (seal/estimate/io_bounds.py)
        lines.append(f"storage bounds: {plan.io.describe()}")
        lines.append("")
    if plan.layout is not None:
        lines.append("placement (actors per node):")
        lines += [f"  {describe_node(n)}" for n in plan.layout.nodes]
        lines += [f"  {shared_line(g, plan)}" for g in plan.shared_gpus]
    lines += [f"note: {n}" for n in plan.notes]
    lines.append("fits: yes" if plan.fits else "fits: no")
    return "\n".join(lines)


def shared_line(g, plan) -> str:
    """A GPU that fractional asks share and its tenants' memory (seal/estimate/shared_gpus.py)."""
    gpu_gb = next(n.gpu_gb for n in plan.layout.nodes if n.name == g.node)
    return describe(g, gpu_gb)


def _adapter_lines(gs, ge, where: str) -> list[str]:
    """vLLM's LoRA slots, where the replicas serve the learner's adapters (seal/runtime/memory.py)."""
    if not gs.max_lora_rank:
        return []
    label = f"LoRA slots ({gs.max_loras} x rank {gs.max_lora_rank}){where}"
    return [f"  {label:<34}{ge.adapters_per_gpu / GB:>8.2f} GB"]


def plan_json(plan) -> dict[str, Any]:
    ls, ge = plan.learner, plan.generator_est
    tokens, scored, packed = micro_batch_tokens(ls)
    out: dict[str, Any] = {
        "fits": plan.fits,
        "learner_gb_per_rank": round(plan.learner_est.device_bytes / GB, 3),
        "generator_gb_per_replica": round(ge.replica_bytes / GB, 3),
        "problems": list(plan.problems),
        "suggestions": list(plan.suggestions),
        "notes": list(plan.notes),
        "hardware": plan.hardware,
        "model": {"name": plan.model.name, "params": plan.model.params(), "config": plan.model_source},
        "learner": {
            "setup": ls.describe(),
            "world_size": ls.world_size,
            "device": ls.device,
            "capacity_gb": plan.learner_capacity_gb,
            "capacity_note": plan.learner_capacity_note,
            "host_gb_per_rank": round(plan.learner_est.host_bytes / GB, 3),
            "micro_batch_tokens": tokens,
            "scored_tokens": scored,
            "packed": packed,
            "terms_gb": {k: round(v / GB, 3) for k, v in plan.learner_est.device.items()},
            "peak_phase": plan.learner_est.phase,
            "lora_rank": ls.lora_rank,
            "phases_gb": {k: round(v / GB, 3) for k, v in plan.learner_est.phases.items()},
            "host_terms_gb": {k: round(v / GB, 3) for k, v in plan.learner_est.host.items()},
        },
        "generator": {
            "replicas": plan.replicas,
            "tensor_parallel_size": ge.tp,
            "device": plan.generator.device,
            "weights_gb_per_gpu": round(ge.weights_per_gpu / GB, 3),
            "kv_bytes_per_token_per_gpu": ge.kv_per_token,
            "kv_budget_gb_per_gpu": round(ge.kv_budget / GB, 3),
            "concurrent_sequences": ge.sequences,
            "max_model_len": plan.generator.max_model_len,
            "max_lora_rank": plan.generator.max_lora_rank,
            "lora_slots_gb_per_gpu": round(ge.adapters_per_gpu / GB, 3),
        },
        "io_bounds": None
        if plan.io is None
        else {
            "checkpoint_gb": round(plan.io.checkpoint_bytes / GB, 3),
            "checkpoint_s": round(plan.io.checkpoint_s, 1),
            "snapshot_gb": round(plan.io.snapshot_bytes / GB, 3),
            "snapshot_s": round(plan.io.snapshot_s, 1),
            "storage_min_mb_s": plan.io.min_mb_s,
        },
        "shared_gpus": [
            {
                "node": g.node,
                "gpu": g.index,
                "gb": round(g.memory_gb(), 3),
                "tenants": [{"actor": t.name, "share": t.share, "gb": t.gb, "how": t.how} for t in g.tenants],
            }
            for g in plan.shared_gpus
        ],
        "nodes": None
        if plan.layout is None
        else [
            {
                "name": n.name,
                "capacity": n.capacity,
                "free": {k: round(v, 3) for k, v in n.free.items()},
                "actors": {
                    role: sum(d.role == role for d in n.placed)
                    for role in ("generator", "learner", "coordinator", "env")
                },
                "host_gb": round(sum(d.host_gb for d in n.placed), 3),
            }
            for n in plan.layout.nodes
        ],
    }
    return out
