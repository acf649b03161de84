"""A model directory's linear layers by name, read from its safetensors headers: no weights, no torch.

vLLM's LoRA serving wraps every module it supports unless the engine names its targets
(``lora_target_modules``), the output head included. Its wrapper on the head computes prompt
log-probs with the batch's per-request LoRA mapping, which has another length than the prompt's
tokens whenever other requests share the batch: the engine core dies (vLLM CPU 0.32; vLLM issues
16668 and 29955 report the same on GPU). The weight-sync canary asks for prompt log-probs while
episodes run, so a replica serving adapters names the layers an adapter can train instead: the
linear layers, never the embeddings or the output head, which is also what peft's ``all-linear``
adapts (learner/lora.py).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

OUTPUT_HEAD = "lm_head"  # the output head's name in every family SEAL serves (docs/models.md)


def _header(path: Path) -> dict:
    """A safetensors file's JSON header: tensor name -> dtype, shape and offsets."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(size))


def linear_layer_names(model_dir: str | Path) -> list[str]:
    """The last names of ``model_dir``'s linear layers (``q_proj``, ``down_proj``, ...): modules
    with a 2-D ``weight``, less the input embeddings and the output head. Sorted, each once."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors file to read its layer names from")
    names = set()
    for path in files:
        for tensor, info in _header(path).items():
            module, _, leaf = tensor.rpartition(".")
            if leaf != "weight" or not isinstance(info, dict) or len(info.get("shape", ())) != 2:
                continue
            last = module.rpartition(".")[2]
            if last != OUTPUT_HEAD and "embed" not in last:
                names.add(last)
    if not names:
        raise ValueError(f"{model_dir}: no linear layer found in {[p.name for p in files]}")
    return sorted(names)
