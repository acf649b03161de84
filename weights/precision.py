"""Which floating-point type the generator and learner run in: ``dtype: auto | bfloat16 | float32``.

``auto`` picks bf16 where the hardware computes it natively and fp32
otherwise. On CPU that means the AMX or AVX512-BF16 flags in /proc/cpuinfo:
without them PyTorch and vLLM emulate bf16 through fp32 and it is slower
than fp32 itself. On CUDA it is bf16 (every GPU these configs target has it).

Measured on the 2-core AMD EPYC (avx512_bf16, no AMX) this was written on:
vLLM CPU bf16 greedy output matches fp32 token for token on short prompts and
per-token logprobs differ by about 0.01 on average (0.13 at most), so the old
"bf16 output is garbage on CPU" note no longer holds for this model and
vLLM 0.32; ``seal bench precision`` re-measures it.

Weights cross Ray's object store as numpy arrays, and numpy has no bf16:
``to_wire_arrays`` sends bf16 as its int16 bit pattern under a marker key and
``from_wire_arrays`` views it back, without copying either way.

Pure and import-light (torch only inside the wire helpers): the learner, the
generator and the config checks all use it, and nothing here imports seal/.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DTYPES = ("auto", "bfloat16", "float32")
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # either one: native bf16 dot products
WIRE_DTYPE_KEY = "__seal_wire_dtype__"  # marks a weights mapping whose int16 arrays are bf16 bits


def check_dtype(dtype: str) -> str:
    """``dtype`` itself, or one ValueError line naming the choices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first processor in a /proc/cpuinfo text (x86 "flags", ARM "Features")."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def read_cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str]:
    try:
        return cpu_flags(Path(path).read_text())
    except OSError:  # not Linux: no flags, so auto stays fp32
        return set()


def resolve_dtype(dtype: str, device: str = "cpu", flags: Iterable[str] | None = None) -> tuple[str, str]:
    """(bfloat16 | float32, why) for a requested ``dtype`` on ``device``; ``flags``: the CPU's (read if None)."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype, f"{dtype} as configured"
    if device == "cuda":
        return "bfloat16", "auto on CUDA"
    found = sorted(set(read_cpu_flags() if flags is None else flags) & set(BF16_CPU_FLAGS))
    if found:
        return "bfloat16", f"auto: the CPU has {' and '.join(found)}"
    return (
        "float32",
        f"auto: the CPU has none of {', '.join(BF16_CPU_FLAGS)} (bf16 would be emulated, slower than fp32)",
    )


def choose_dtype(dtype: str, device: str, who: str) -> str:
    """``resolve_dtype`` and one log line saying what ``who`` runs in and why."""
    chosen, why = resolve_dtype(dtype, device)
    log.warning("%s dtype %s (%s)", who, chosen, why)  # WARNING: the level these components' logs show at
    return chosen


def to_wire_arrays(named_tensors: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """name -> numpy array, zero-copy; bf16 tensors go as their int16 bits, the mapping then marked."""
    import torch

    out: dict[str, Any] = {}
    for name, t in named_tensors:
        if t.dtype == torch.bfloat16:
            out[WIRE_DTYPE_KEY] = "bfloat16"
            t = t.view(torch.int16)
        out[name] = t.numpy()
    return out


def from_wire_arrays(source: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of ``to_wire_arrays``: name -> tensor, sharing the arrays' memory."""
    import numpy as np  # noqa: PLC0415 - with torch, off the config path (seal.config imports this module)
    import torch

    bf16 = source.get(WIRE_DTYPE_KEY) == "bfloat16"
    out = {}
    for name, v in source.items():
        if name == WIRE_DTYPE_KEY:
            continue
        if isinstance(v, np.ndarray):
            v = torch.from_numpy(v)
            if bf16 and v.dtype == torch.int16:
                v = v.view(torch.bfloat16)
        out[name] = v
    return out
