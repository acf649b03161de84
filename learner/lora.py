"""LoRA on the policy (``learner.cfg.lora``): peft adapters train, the base weights stay frozen.

With ``lora.rank`` set the learner wraps its policy in a peft LoRA adapter after loading it: only
the adapter's matrices require gradients, so the optimizer is built on them alone (no gradients
and no optimizer state for the base weights). The KL reference is the same model with the adapter
disabled (``AdapterOffReference``): the frozen base weights are exactly the initial policy, so no
second copy of the weights is loaded. Checkpoints hold the trainable tensors only (the base
weights come from ``model_path`` at every start), and ``write_adapter`` writes what a generator
serving the base model needs for a policy version: peft's adapter directory
(adapter_config.json + adapter_model.safetensors), megabytes where a full publish is the model.
Whole-model weights out (publishes to engines that load whole weights, snapshots the evaluators
load) are the base with the adapter merged, under the base's names (``merged_model``).

Adapter dropout must be 0: the first mini-batch's pi_old is its own training forward's detached
log-probabilities (learner/engine.py), and the weight-sync canary compares the learner's
log-probabilities with the generator's; both need a deterministic forward.

Under ZeRO-3 ``from_pretrained`` partitions the base as it loads it; peft then adds the adapter's
matrices whole on every rank (the same seed, so the same initial A everywhere), and
``deepspeed.initialize`` partitions those too (DeepSpeedZeRoOffload converts the parameters not yet
partitioned). Whatever reads the adapter or the base whole then gathers it, every rank in step
(``gathered``): the adapter (megabytes) for a publish, the whole model for a merged one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weights.buckets import put_buckets
from weights.layer_names import OUTPUT_HEAD

ADAPTER = "default"  # peft's name for the one adapter
PUBLISH_MODES = ("adapter", "merged")


@dataclass(frozen=True)
class LoraConfig:
    """``rank`` None: no adapter, every weight trains (as without this section)."""

    rank: int | None = None
    alpha: int = 16  # the adapter's update is scaled by alpha / rank (peft's lora_alpha)
    dropout: float = 0.0
    # peft's target_modules: "all-linear" (every Linear but the output head) or module names.
    target_modules: str | Sequence[str] = "all-linear"
    # What a publish sends: "adapter" (its tensors alone; generators serve the base once and each
    # version as a vLLM LoRA adapter, actors/generation/adapter_updates.py) or "merged" (the whole
    # model with the adapter merged, for generators that load whole weights only).
    publish: str = "adapter"

    def __post_init__(self) -> None:
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"lora.rank must be >= 1 (null: no adapter), got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha}")
        if self.dropout != 0:
            raise ValueError(
                f"lora.dropout must be 0, got {self.dropout}: pi_old and the weight-sync canary need a "
                "deterministic forward (learner/lora.py)"
            )
        if self.publish not in PUBLISH_MODES:
            raise ValueError(f"lora.publish must be one of {PUBLISH_MODES}, got {self.publish!r}")
        if isinstance(self.target_modules, str) and not self.target_modules:
            raise ValueError("lora.target_modules is empty")
        if (
            self.publish == "adapter"
            and not isinstance(self.target_modules, str)
            and OUTPUT_HEAD in self.target_modules
        ):
            raise ValueError(
                f"lora.target_modules has {OUTPUT_HEAD}, which generators serving adapters leave out (an adapter "
                "on the output head breaks vLLM's prompt log-probs: weights/layer_names.py); drop it or "
                "set lora.publish=merged"
            )


def lora_on(cfg: Any) -> bool:
    """Whether a LearnerConfig trains a LoRA adapter."""
    return cfg.lora is not None and cfg.lora.rank is not None


@contextlib.contextmanager
def gathered(model: Any, zero3: bool, adapter_only: bool = True) -> Iterator[None]:
    """Under ZeRO-3, ``model``'s adapter (``adapter_only``) or every parameter gathered whole for the
    block, then partitioned again: a collective of the training group, so every rank enters it in
    step. Without ZeRO-3 every rank holds the whole model: nothing to do."""
    if not zero3:
        yield
        return
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad] if adapter_only else list(model.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


@contextlib.contextmanager
def plain_loading() -> Iterator[None]:
    """``from_pretrained`` loading whole weights in this block even where a ZeRO-3 learner keeps
    transformers' DeepSpeed config active (it would partition the model as it loads, a collective):
    the merged model is a plain one, built on one rank."""
    from transformers.integrations import deepspeed as hf_deepspeed

    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    active = ref() if ref is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if active is not None:
            hf_deepspeed.set_hf_deepspeed_config(active)


def add_adapter(model: Any, lora: LoraConfig) -> Any:
    """``model`` wrapped in a fresh LoRA adapter (peft); the base weights frozen. Its B matrices start
    at 0, so the wrapped model computes exactly what ``model`` did."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    config = PeftLoraConfig(
        r=int(lora.rank or 0),
        lora_alpha=int(lora.alpha),
        lora_dropout=0.0,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config, adapter_name=ADAPTER)


def trainable_parameters(model: Any) -> list[Any]:
    """The parameters the optimizer updates: every one without LoRA, the adapter's with it."""
    return [p for p in model.parameters() if p.requires_grad]


class AdapterOffReference:
    """The KL reference under LoRA: the policy's own module with its adapter disabled, i.e. the
    frozen base weights (the initial policy). The learner forwards it without a graph, as it does a
    separate reference model; ``module`` is what its scoring head attaches to (learner/scoring_head.py)."""

    def __init__(self, peft_model: Any) -> None:
        self.module = peft_model

    def __call__(self, **inputs: Any) -> Any:
        with self.module.disable_adapter():
            return self.module(**inputs)


def trainable_state(model: Any) -> dict[str, Any]:
    """The trainable tensors of ``model`` by state-dict name (the adapter's under LoRA), copied."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().clone() for n, t in model.state_dict().items() if n in names}


def load_trainable_state(model: Any, state: Mapping[str, Any], path: Path) -> None:
    """Load ``trainable_state``'s tensors; refuse a checkpoint that lacks one or holds others."""
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"checkpoint {path} does not hold this learner's trainable tensors (LoRA settings differ?): "
            f"missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}"
        )
    model.load_state_dict(dict(state), strict=False)


def write_adapter(model: Any, directory: str | Path) -> tuple[Path, int]:
    """Write the adapter as peft lays it out (adapter_config.json, adapter_model.safetensors: what
    vLLM's LoRARequest loads) under ``directory``; returns it and the bytes written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True, selected_adapters=[ADAPTER])
    return out, sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def merged_weights(peft_model: Any, device: Any = None) -> dict[str, Any]:
    """The base model's weights with the adapter merged in (W + scaling x B A), under the base
    model's own names: what a generator loading whole weights (not adapters) serves for this policy.
    ``device``: where the merged tensors go, each as it is made (None: beside the policy's), so a
    CUDA learner merging onto the host holds one merged weight on the GPU at a time."""
    from peft.tuners.lora import LoraLayer

    inner = peft_model.get_base_model()
    layers: dict[str, Any] = {  # each LoRA layer kind (Linear, Embedding, ...) defines get_delta_weight
        f"{name}.base_layer.weight": module
        for name, module in inner.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A
    }
    out = {}
    for name, tensor in inner.state_dict().items():
        if ".lora_" in name:
            continue
        # One delta at a time: made, added, dropped (all at once they are the linear layers' size again).
        merged = (
            tensor.detach() + layers[name].get_delta_weight(ADAPTER).to(tensor.dtype)
            if name in layers
            else tensor.detach()
        )
        out[name.replace(".base_layer.", ".")] = merged if device is None else merged.to(device)
    return out


def merged_model(peft_model: Any, model_path: str, on_host: bool = False) -> Any:
    """A plain model of ``model_path``'s class holding ``merged_weights``: weights out of a LoRA
    learner (whole-model publishes, snapshots the evaluators load) read it, then drop it. Built per
    call, so the learner holds no second copy of the weights between calls. ``on_host``: built in
    host memory (what copies the weights to the host anyway: snapshots, the object store's buckets),
    not beside the policy, whose GPU then holds no second model (seal/estimate/memory.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    with plain_loading():
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    device: Any = "cpu" if on_host else next(peft_model.parameters()).device
    weights = merged_weights(peft_model, device="cpu" if on_host else None)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"merged LoRA weights do not fit {model_path}: missing {missing}, unexpected {unexpected}")
    return model.to(device).eval()


def merged_skeleton(model_path: str) -> Any:
    """``model_path``'s model on the meta device, fp32: the names and shapes ``merged_model`` has,
    with no weights read (what the broadcast group's metadata needs, on rank 0 alone)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with plain_loading(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def adapter_tensors(peft_model: Any, dtype: Any = None) -> dict[str, Any]:
    """The adapter as a publish carries it to generators serving adapters (actors/generation/
    adapter_updates.py): peft's saved names (what adapter_model.safetensors holds, vLLM's names for
    it), each lora_B multiplied by its layer's alpha / rank. vLLM folds that scaling into B when it
    loads an adapter (LoRALayerWeights.optimize); done here first, the tensors alone say everything
    the generator needs (it writes lora_alpha = r). Cast to ``dtype`` (None: as trained), on CPU."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import get_peft_model_state_dict

    scaling = {
        f"{name}.lora_B.weight": float(module.scaling[ADAPTER])
        for name, module in peft_model.named_modules()
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_B
    }
    out = {}
    for name, tensor in get_peft_model_state_dict(peft_model, adapter_name=ADAPTER).items():
        t = tensor.detach().float() * scaling[name] if name in scaling else tensor.detach().float()
        out[name] = t.to("cpu", dtype or tensor.dtype)
    if not out or len(scaling) * 2 != len(out):
        raise RuntimeError(f"the policy's adapter has {len(out)} tensors for {len(scaling)} LoRA layers")
    return out


def publishes_adapter(cfg: Any) -> bool:
    """Whether a LearnerConfig's publishes carry the adapter alone (``lora.publish: adapter``) rather
    than the merged model: the generators then serve the base once and each version as an adapter."""
    return cfg.lora is not None and cfg.lora.rank is not None and cfg.lora.publish == "adapter"


def adapter_manifest(peft_model: Any, dtype: str | None, bucket_mb: float) -> Any:
    """``adapter_tensors`` in the generator's ``dtype`` into Ray's object store (weights/buckets.py), as
    whole-model publishes go: a manifest a replica fetches bucket by bucket. Megabytes: one bucket,
    unless ``bucket_mb`` is smaller than the adapter."""
    import torch

    from learner.weight_broadcast import weight_buckets

    tensors = adapter_tensors(peft_model, getattr(torch, dtype) if dtype else None)
    buckets = weight_buckets(list(tensors.items()), int(bucket_mb * 2**20))
    sent = dtype or str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    return put_buckets(iter(buckets), sent, bucket_mb)


def adapter_metadata(peft_model: Any, dtype: Any = None) -> list[Any]:
    """What ``adapter_tensors`` sends over the broadcast group, cast to ``dtype`` (a torch dtype). Rank 0
    alone asks, so nothing is gathered: a ZeRO-3 parameter keeps its whole shape as ``ds_shape``."""
    from peft.utils import get_peft_model_state_dict

    from weights.broadcast_group import WeightMeta

    # peft's saved names are the parameters' without the adapter's name (".default").
    params = {n.replace(f".{ADAPTER}.", "."): p for n, p in peft_model.named_parameters() if p.requires_grad}
    names = list(get_peft_model_state_dict(peft_model, adapter_name=ADAPTER))  # no collective: names only
    if set(names) != set(params):
        raise RuntimeError(
            f"the adapter's saved names {sorted(names)[:2]} do not match its parameters {sorted(params)[:2]}"
        )
    return [WeightMeta.of(n, getattr(params[n], "ds_shape", params[n].shape), dtype or params[n].dtype) for n in names]


def broadcast_adapter(peft_model: Any, broadcaster: Any, zero3: bool = False) -> float:
    """Send ``adapter_tensors`` over the weight group (rank 0; the broadcaster casts to the generator's
    dtype, as ``adapter_metadata`` said); seconds. Other ranks pass None: under ZeRO-3 they join the
    adapter's gather, under ZeRO-2 each holds it whole and has nothing to do."""
    with gathered(peft_model, zero3):
        if broadcaster is None:
            return 0.0
        return broadcaster.broadcast(adapter_tensors(peft_model))
