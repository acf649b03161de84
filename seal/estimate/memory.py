"""Memory a configuration asks of each device: pure functions of typed inputs (`seal plan`).

Everything is in bytes until the caller divides by ``GB`` (1e9: GPU makers' "80 GB" and
docs/design.md's figures use decimal gigabytes). The model is read from its
config.json only (``ModelSpec.from_config``): no weights.

Learner, per rank (what this repo's learner holds: learner/engine.py loads the model in
fp32 and bf16 is torch autocast around the forwards, so weights, gradients and optimizer
state are fp32 in both precisions; P parameters, N ranks). The peak is what a rank holds
throughout plus the largest of its phases' transient terms (``learner_phases``; the table
names the phase). Held throughout:

- weights 4P, sharded /N under ZeRO-3, in host memory with ``offload_param``;
- gradients 4P, sharded /N under ZeRO-2/3, in host memory with ``offload_optimizer``;
- fp32 master partition 4P/N: ZeRO-1/2 always keep one beside the weights (even fp32 ones),
  ZeRO-3 only when the optimizer is offloaded (on the host); none for torch / stage 0;
- optimizer state: AdamW m and v 8P (plain SGD: none), sharded /N under ZeRO >= 1, host with
  ``offload_optimizer``;
- reference model (KL coefficient != 0; none at 0): a frozen fp32 copy, 4P, sharded /N
  under ZeRO-3 (host with ``offload_param``), whole otherwise;
- DeepSpeed buffers: ZeRO-1/2 a reduce and an all-gather bucket of min(P, 5e8) fp32 each;
  ZeRO-3 the reduce bucket;
- runtime: 3 GB per CUDA process (context, NCCL, allocator slack), 1 GB per CPU process.

Under LoRA (``lora_rank`` R; learner/lora.py) the base's 4P stays frozen (whole, or 4P/N under ZeRO-3,
where the adapter is partitioned too): gradients, master partition and optimizer state count the
adapter's A parameters only
(``ModelSpec.lora_params``: R x (in + out) of every linear layer but the head), there is no reference
copy (the reference is the base with the adapter off), the policy forward's autocast caches casts of
the adapter alone (the base's one weight at a time, as the reference's), and a snapshot for the
evaluators builds the merged model for the call: another 4P, in host memory (a phase holding one
weight, its delta and their sum on the device), or on the device when publishes broadcast merged
weights (``lora_merge_on_device``: lora.publish merged with weight_sync broadcast). Under ZeRO-3 that
merge first gathers the whole model on every rank's device (4P, one collective: learner/weights_out.py).

Phases of a step (T tokens forwarded in a micro-batch: micro_batch_size x seq_len, or, packed
with shared_prefix and micro_batch_size >= 2, prompt + micro_batch_size x response; K =
micro_batch_size x response scored positions; c compute bytes, 2 in bf16, 4 in fp32):

- every training phase holds the activations: one decoder layer's working set per token is
  ``c x (6 x hidden + 4 x intermediate) + 4 x (4 x hidden)`` bytes (q, k, v, attention
  output, o and MLP inputs, gate, up, activation and product; plus the fp32 residual stream's
  norm inputs and outputs; attention scores are not stored with SDPA). With gradient
  checkpointing the layer inputs are kept, ``layers x T x hidden x 4``, plus one layer's working
  set (recomputed in backward; the reference's no-grad layer in its forward); without it every
  layer's working set. Packed micro-batches on a GPU add the continuations' masks, continuation
  tokens x (prefix + response) x (1 + c) (the boolean mask and the float bias SDPA builds from it;
  each continuation attends to the prefix and itself), and their keys and values: the prefix
  copied beside each continuation, micro_batch_size x (prefix + response) x head_dim x c for k and
  for v at kv_heads, then, a mask being given, repeated to every query head by transformers' SDPA
  (``repeat_kv``; ``enable_gqa`` only without a mask), at heads: one layer's both in a forward, and
  without gradient checkpointing every layer's repeat is kept for the backward (``packed_kv_bytes``;
  a 7B with 8 continuations of 512 tokens on a 6K prompt: 0.87 GB a layer, 0.76 of it the
  repeat); on CPU the two unmasked blocks need none;
- policy forward (inside autocast): weight casts 2P in bf16 (autocast caches the bf16 copy of
  every weight that needs a gradient until the forward ends, so a whole bf16 model exists at its
  end; under ZeRO-3 too: the gathered parameter is released, its cast is not); under ZeRO-3 the
  gathered fp32 parameters of the module running (at most the larger of a decoder layer and the
  embedding) and of one prefetched layer; the head's working set: with ``logprob_head=chunked``
  (the default) one chunk of logits, ``min(K, rows) x vocab x 14`` (the matmul's bf16 output, its
  fp32 copy, softmax and product; rows: 16 MB of fp32 logits on CPU, 256 MB on CUDA, at least 64,
  learner/token_logprobs.py), and nothing of the vocabulary kept for the loss or the backward; with ``full`` the forward's logits ``K x vocab x c``;
- loss (after autocast: the casts are freed): chunked, nothing of the vocabulary; full: logits
  ``K x vocab x (c + 20)`` in bf16 (the forward's logits, their fp32 copy, the fp32 log-softmax
  kept for backward, and the entropy metric's three fp32 temporaries: softmax, log-softmax and
  their product), ``K x vocab x 20`` in fp32 (the copy is the tensor itself). Backward holds less
  (chunked: one chunk again; full: the gradients of the logits);
- reference forward (KL coefficient != 0), under the policy's autocast (learner/ds_config.py
  gives both engines the same section): the reference's gathered parameters under ZeRO-3 (the
  policy's are released by then), the bf16 cast of one weight at a time (2 x the largest weight:
  a frozen weight needs no gradient, so autocast caches no cast of it), the head's chunk
  (chunked) or logits ``K x vocab x (4 + c + 4 + 4)`` in bf16 (full: the policy's kept
  log-softmax; the reference's logits, fp32 copy and log-softmax), ``K x vocab x 12`` in fp32;
- publish and the generator's copy (between steps): under ZeRO-3 one gathered bucket,
  max(``weight_bucket_mb``, 4 x the largest weight) (learner/weights_out.py gathers a bucket at a
  time on every rank); rank 0 copies the same to the host (``weights_out``, a host term).

Generator, per replica of ``tp`` GPUs (vLLM): weights P x bytes / tp per GPU; KV cache per
token 2 x layers x kv_heads x head_dim x bytes, kv heads split over the shards (replicated
when tp > kv_heads); vLLM takes ``gpu_memory_utilization`` of each GPU, keeps 2 GB of it for
its activation peak and CUDA graphs, and the rest buys KV: concurrent sequences of
max_model_len = KV budget per GPU / (KV per token per GPU x max_model_len). On CPU the KV
budget is ``cpu_kv_cache_gb`` GiB per worker (vLLM's kv_cache_memory_bytes; fractions allowed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from learner.token_logprobs import chunk_rows

GB = 1e9
GIB = 2**30
DS_BUCKET = 5e8  # DeepSpeed's default reduce / all-gather bucket (elements)
CUDA_RUNTIME = 3 * GB
CPU_RUNTIME = 1 * GB
VLLM_RESERVE = 2 * GB  # vLLM's activation peak (profiled) and CUDA graphs, inside gpu_memory_utilization
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers of a decoder-only HF model (Llama / Qwen2 family)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, config_json: Mapping[str, Any], name: str = "") -> ModelSpec:
        try:
            hidden, heads = int(config_json["hidden_size"]), int(config_json["num_attention_heads"])
            return cls(
                name=name or str(config_json.get("_name_or_path") or config_json.get("model_type", "model")),
                hidden=hidden,
                layers=int(config_json["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(config_json.get("num_key_value_heads") or heads),
                head_dim=int(config_json.get("head_dim") or hidden // heads),
                intermediate=int(config_json["intermediate_size"]),
                vocab=int(config_json["vocab_size"]),
                tied=bool(config_json.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases (its config has no switch); Llama says attention_bias.
                qkv_bias=bool(config_json.get("attention_bias", config_json.get("model_type") == "qwen2")),
            )
        except KeyError as exc:
            raise ValueError(f"{name or 'config.json'}: no {exc.args[0]} (not a decoder-only HF config)") from None

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden  # SwiGLU MLP, two RMSNorms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() * (1 if self.tied else 2) + self.hidden

    def lora_params(self, rank: int) -> int:
        """A rank-``rank`` adapter on every linear layer but the head (peft's all-linear): A [r, in] and
        B [out, r] on q, k, v, o, gate, up and down of each layer."""
        q, kv, h, i = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden, self.intermediate
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return rank * self.layers * per_layer

    def kv_heads_per_shard(self, tp: int) -> int:
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """KV cache of one token on one GPU of a ``tp``-way replica."""
        return 2 * self.layers * self.kv_heads_per_shard(tp) * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class LearnerSetup:
    backend: str = "deepspeed"  # deepspeed | torch
    zero_stage: int = 2
    world_size: int = 1
    device: str = "cuda"
    dtype: str = "bfloat16"  # the compute dtype (autocast); weights stay fp32
    optimizer: str = "adamw"
    offload_optimizer: bool = False
    offload_param: bool = False
    reference: bool = True  # KL coefficient != 0
    gradient_checkpointing: bool = True
    micro_batch_size: int = 1
    shared_prefix: bool = False
    seq_len: int = 4096  # longest trajectory (generator.max_model_len)
    response_len: int = 1024  # scored tokens per trajectory (sampling.max_new_tokens)
    weight_bucket_mb: float = 256.0  # ZeRO-3 gathers weights out (publish, the generator's copy) this many MB at a time
    logprob_head: str = "chunked"  # chunked (learner/token_logprobs.py) | full (whole-vocabulary logits kept)
    lora_rank: int | None = None  # learner.cfg.lora.rank: an adapter trains, the base is frozen
    lora_merge_on_device: bool = False  # the merged model is built beside the policy (a merged broadcast)

    @property
    def stage(self) -> int:
        return self.zero_stage if self.backend == "deepspeed" else 0

    def describe(self) -> str:
        zero = (
            f"ZeRO-{self.stage} over {self.world_size} rank{'s' * (self.world_size > 1)}"
            if self.stage
            else "torch, 1 rank"
        )
        off = [k for k, v in (("optimizer", self.offload_optimizer), ("params", self.offload_param)) if v]
        lora = f", LoRA rank {self.lora_rank}" if self.lora_rank else ""
        return f"{zero}, {self.dtype}, {self.device}{lora}" + (f", offload {'+'.join(off)}" if off else "")


def trained_params(m: ModelSpec, s: LearnerSetup) -> int:
    """The parameters with gradients, optimizer state and a place in checkpoints: all, or the adapter's."""
    return m.lora_params(s.lora_rank) if s.lora_rank else m.params()


@dataclass(frozen=True)
class Estimate:
    """Bytes by term, on the device (GPU, or host memory for a CPU actor) and on the host."""

    device: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    phase: str = ""  # the step phase whose transient terms are in ``device`` (the peak's)
    phases: dict[str, float] = field(default_factory=dict)  # each phase's transient bytes

    @property
    def device_bytes(self) -> float:
        return sum(self.device.values())

    @property
    def host_bytes(self) -> float:
        return sum(self.host.values())


def micro_batch_tokens(s: LearnerSetup) -> tuple[int, int, bool]:
    """(tokens forwarded, tokens scored, packed) for one micro-batch at the configured lengths."""
    response = min(s.response_len, s.seq_len - 1)
    packed = s.shared_prefix and s.micro_batch_size >= 2
    tokens = (s.seq_len - response) + s.micro_batch_size * response if packed else s.micro_batch_size * s.seq_len
    return tokens, s.micro_batch_size * response, packed


def layer_bytes_per_token(m: ModelSpec, compute_bytes: int) -> int:
    return compute_bytes * (6 * m.hidden + 4 * m.intermediate) + 4 * (4 * m.hidden)


def _logits_bytes_per_element(compute_bytes: int, phase: str) -> int:
    """Bytes per scored position per vocabulary entry that the logits hold in ``phase``.

    policy forward: the forward's logits (c). loss: the forward's logits, their fp32 copy (none in
    fp32: the copy is the tensor itself), the fp32 log-softmax kept for backward and the entropy
    metric's three fp32 temporaries (softmax, log-softmax, their product). reference forward: the
    policy's kept log-softmax (4) plus the reference's logits, fp32 copy and log-softmax (c + 4 + 4).
    """
    copy = 4 if compute_bytes != 4 else 0
    return {
        "policy_forward": compute_bytes,
        "loss": compute_bytes + copy + 4 + 12,
        "reference_forward": 4 + compute_bytes + copy + 4,
    }[phase]


def packed_kv_bytes(m: ModelSpec, s: LearnerSetup) -> tuple[float, float]:
    """The packed continuations' keys and values on a GPU (learner/packing.py ``_continuations``, the
    module docstring): (one layer's, in its forward; what each layer keeps for its backward)."""
    tokens, scored, packed = micro_batch_tokens(s)
    if not packed or s.device == "cpu":
        return 0.0, 0.0
    response = scored // s.micro_batch_size
    both = 2 * s.micro_batch_size * (tokens - scored + response) * m.head_dim * DTYPE_BYTES[s.dtype]  # k and v
    repeated = m.heads if m.heads > m.kv_heads else 0
    return float(both * (m.kv_heads + repeated)), float(both * (repeated or m.kv_heads))


def learner_phases(m: ModelSpec, s: LearnerSetup) -> dict[str, dict[str, float]]:
    """The transient terms of each phase of a step (the module docstring), by phase."""
    p, stage, cb = m.params(), s.stage, DTYPE_BYTES[s.dtype]
    tokens, scored, packed = micro_batch_tokens(s)
    layer = layer_bytes_per_token(m, cb) * tokens
    activations = (m.layers * tokens * m.hidden * 4 + layer) if s.gradient_checkpointing else m.layers * layer
    # The packed continuations' masks: each continuation's queries against the prefix and itself (CUDA's
    # masked SDPA; the CPU path has none), the boolean mask and the float bias SDPA builds from it.
    mask = scored * (tokens - scored + s.response_len) * (1 + cb) if packed and s.device != "cpu" else 0
    kv_layer, kv_kept = packed_kv_bytes(m, s)
    kv = kv_layer if s.gradient_checkpointing else kv_layer + (m.layers - 1) * kv_kept
    gathered = (max(m.layer_params(), m.embedding_params()) + m.layer_params()) * 4 if stage == 3 else 0
    largest = max(m.embedding_params(), m.hidden * m.intermediate)  # the largest single weight

    def logits(phase: str) -> float:
        if s.logprob_head == "chunked":  # one chunk of fp32 logits and its softmax temporaries, nothing kept
            return 0.0 if phase == "loss" else min(scored, chunk_rows(m.vocab, device_type=s.device)) * m.vocab * 14
        return scored * m.vocab * _logits_bytes_per_element(cb, phase)

    phases = {
        "policy_forward": {
            "gathered": gathered,
            # Under LoRA the frozen base's casts are not cached: one weight at a time, and the adapter.
            "weight_casts": (2 * (largest + m.lora_params(s.lora_rank)) if s.lora_rank else 2 * p) if cb == 2 else 0,
            "activations": activations,
            "prefix_mask": mask,
            "prefix_kv": kv,
            "logits": logits("policy_forward"),
        },
        "loss": {
            "activations": activations,
            "prefix_mask": mask,
            "prefix_kv": 0 if s.gradient_checkpointing else m.layers * kv_kept,
            "logits": logits("loss"),
        },
        "publish": {"gathered": max(s.weight_bucket_mb * 2**20, 4 * largest) if stage == 3 else 0},
    }
    if s.reference:
        phases["reference_forward"] = {
            "gathered": gathered,
            "reference_casts": 2 * largest if cb == 2 else 0,
            "activations": activations,
            "prefix_mask": mask,
            "prefix_kv": kv_layer,  # no grad: nothing kept
            "logits": logits("reference_forward"),
        }
    kept = {name: {k: float(v) for k, v in terms.items() if v} for name, terms in phases.items()}
    return {name: terms for name, terms in kept.items() if terms}  # publish below ZeRO-3 gathers nothing


def learner_memory(m: ModelSpec, s: LearnerSetup) -> Estimate:
    """Peak memory of one learner rank: what it holds throughout plus the largest phase's transient
    terms (the module docstring gives every term); ``Estimate.phase`` names that phase."""
    p, n, stage = m.params(), s.world_size, s.stage
    device: dict[str, float] = {}
    host: dict[str, float] = {}

    def put(term: str, value: float, on_host: bool) -> None:
        if value:
            (host if on_host else device)[term] = float(value)

    put("weights", 4 * p / (n if stage == 3 else 1), s.offload_param)
    trained = p  # what gets gradients and optimizer state: every weight, or the adapter alone
    if s.lora_rank:
        trained = m.lora_params(s.lora_rank)
        put("adapter", 4 * trained / (n if stage == 3 else 1), s.offload_param)
    put("gradients", 4 * trained / (n if stage >= 2 else 1), s.offload_optimizer)
    if stage in (1, 2) or (stage == 3 and s.offload_optimizer):
        put("master", 4 * trained / n, s.offload_optimizer)
    adam = 8 * trained if s.optimizer == "adamw" else 0
    put("optimizer", adam / (n if stage >= 1 else 1), s.offload_optimizer)
    if s.reference and not s.lora_rank:  # under LoRA: the base with the adapter off, no copy
        put("reference", 4 * p / (n if stage == 3 else 1), stage == 3 and s.offload_param)
    bucket = min(trained, DS_BUCKET) * 4
    put("buffers", 2 * bucket if stage in (1, 2) else bucket if stage == 3 else 0, False)
    phases = learner_phases(m, s)
    if s.lora_rank:  # a snapshot's merged model (learner/lora.py merged_model), built for the call
        on_host = s.device == "cuda" and not s.lora_merge_on_device
        largest = max(m.embedding_params(), m.hidden * m.intermediate)
        # On the host: the device holds one weight's delta and their sum at a time (learner/lora.py merged_weights).
        phases["snapshot_merge"] = {"merge_weight": 8.0 * largest} if on_host else {"merged_weights": 4.0 * p}
        if stage == 3:  # the merge reads the base whole: every rank gathers the model (learner/weights_out.py)
            phases["snapshot_merge"]["gathered_model"] = 4.0 * p
        put("merged_model", 4.0 * p if on_host else 0, True)
    peak = max(phases, key=lambda name: sum(phases[name].values()))
    for term, value in phases[peak].items():
        put(term, value, False)
    put("runtime", CUDA_RUNTIME if s.device == "cuda" else CPU_RUNTIME, False)
    if s.device == "cuda":  # publish: rank 0 copies one gathered tensor at a time to the host to write it
        put(
            "weights_out",
            max(s.weight_bucket_mb * 2**20, 4 * max(m.embedding_params(), m.hidden * m.intermediate)),
            True,
        )
    else:  # a CPU learner's "device" is host memory: one pool (the snapshot is written from it in place)
        host, device = {}, {**device, **{f"{k} (offloaded)": v for k, v in host.items()}}
    return Estimate(device, host, peak, {k: sum(v.values()) for k, v in phases.items()})


@dataclass(frozen=True)
class GeneratorSetup:
    device: str = "cuda"
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = 0.85  # CUDA only (None: a CPU engine's options have none)
    max_model_len: int = 4096
    cpu_kv_cache_gb: float | None = 2.0  # CPU only: GiB per worker (vLLM's kv_cache_memory_bytes)
    max_lora_rank: int = 0  # LoRA serving (actors/generation/adapters.py): slots of this rank
    max_loras: int = 2


@dataclass(frozen=True)
class GeneratorEstimate:
    weights_per_gpu: float  # bytes (whole model on CPU)
    kv_per_token: float  # bytes per token on one GPU (whole replica on CPU)
    kv_budget: float  # bytes of KV per GPU (the whole cache on CPU)
    sequences: int  # concurrent sequences of max_model_len
    reserved_per_gpu: float  # what the replica takes of each GPU (host memory on CPU)
    tp: int
    adapters_per_gpu: float = 0.0  # vLLM's LoRA slots: max_loras adapters of max_lora_rank, in the dtype

    @property
    def replica_bytes(self) -> float:
        return self.reserved_per_gpu * self.tp


def generator_memory(m: ModelSpec, g: GeneratorSetup, gpu_bytes: float | None) -> GeneratorEstimate:
    """One vLLM replica; ``gpu_bytes`` is one GPU's memory (None: unknown, the KV budget is then 0)."""
    wb = DTYPE_BYTES[g.dtype]
    share = g.gpu_memory_utilization if g.device == "cuda" else g.cpu_kv_cache_gb
    if share is None:  # seal/config.py GeneratorConfig refuses an option without its device's key
        raise ValueError(
            f"a {g.device} generator needs {'gpu_memory_utilization' if g.device == 'cuda' else 'cpu_kv_cache_gb'}"
        )
    # vLLM allocates every slot's A and B stacks at start (LoRA layers' create_lora_weights), sharded
    # with tensor parallelism; on CUDA inside gpu_memory_utilization, so they come out of the KV budget.
    slots = g.max_loras * m.lora_params(g.max_lora_rank) * wb if g.max_lora_rank else 0.0
    weights: float  # bytes; the CUDA branch shards them over tensor-parallel ranks
    if g.device != "cuda":
        weights, kv_token = m.params() * wb, m.kv_bytes_per_token(wb, 1)
        budget = share * GIB
        held = weights + slots + budget + CPU_RUNTIME
        return GeneratorEstimate(weights, kv_token, budget, int(budget // (kv_token * g.max_model_len)), held, 1, slots)
    tp = g.tensor_parallel_size
    weights, kv_token, slots = m.params() * wb / tp, m.kv_bytes_per_token(wb, tp), slots / tp
    if gpu_bytes is None:
        return GeneratorEstimate(weights, kv_token, 0.0, 0, weights + slots + VLLM_RESERVE, tp, slots)
    taken = gpu_bytes * share
    budget = max(0.0, taken - weights - slots - VLLM_RESERVE)
    return GeneratorEstimate(weights, kv_token, budget, int(budget // (kv_token * g.max_model_len)), taken, tp, slots)


def tp_divides(m: ModelSpec, tp: int) -> bool:
    """vLLM's rule: attention heads split evenly, kv heads split or replicate evenly."""
    return tp >= 1 and m.heads % tp == 0 and (m.kv_heads % tp == 0 or tp % m.kv_heads == 0)


def smallest_fitting(sizes: list[int], fits) -> int | None:
    return next((x for x in sizes if fits(x)), None)


def powers_of_two(start: int, limit: int = 64) -> list[int]:
    return [2**k for k in range(int(math.log2(max(1, start))), int(math.log2(limit)) + 1) if 2**k >= start]
