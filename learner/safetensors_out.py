"""Safetensors files written tensor by tensor, for snapshots of a model no process holds whole.

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's
dtype, shape and byte range, then the tensors' bytes back to back. Every name, dtype and shape is
known before any weight is gathered (ZeRO-3 keeps them as ds_shape), so the header goes first and
each tensor's bytes follow as its bucket arrives: the writer never holds more than the tensor in
hand. The layout is Hugging Face's: one ``model.safetensors`` up to ``max_shard_bytes``, beyond it
``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json`` (what
``save_pretrained`` writes, what transformers and vLLM load).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weights.buckets import bucket_bounds

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# torch dtype name -> (safetensors dtype, bytes per element)
DTYPES = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "bfloat16": ("BF16", 2),
    "float16": ("F16", 2),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}


@dataclass(frozen=True)
class TensorSpec:
    """What one tensor of a file will be: its name, torch dtype name (``float32``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: safetensors snapshots take {', '.join(DTYPES)}; got {self.dtype}")

    @classmethod
    def of(cls, name: str, shape, dtype) -> TensorSpec:
        return cls(name, str(dtype).removeprefix("torch."), tuple(int(d) for d in shape))

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * DTYPES[self.dtype][1]


def shard_layout(specs: Sequence[TensorSpec], max_shard_bytes: int) -> list[tuple[str, list[TensorSpec]]]:
    """(file name, its tensors) in order: consecutive tensors up to ``max_shard_bytes`` a file
    (a larger tensor alone), named as ``save_pretrained`` names them."""
    bounds = bucket_bounds([s.nbytes for s in specs], max_shard_bytes) or [range(0)]
    if len(bounds) == 1:
        return [(SAFE_WEIGHTS_NAME, list(specs))]
    n = len(bounds)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", list(specs[r.start : r.stop])) for i, r in enumerate(bounds)]


def write_index(
    directory: Path, layout: list[tuple[str, list[TensorSpec]]], total_parameters: int | None = None
) -> None:
    """The shard index transformers and vLLM read when there is more than one file."""
    if len(layout) < 2:
        return
    weight_map = {s.name: file for file, specs in layout for s in specs}
    total = sum(s.nbytes for _, specs in layout for s in specs)
    metadata = {"total_size": total, **({"total_parameters": total_parameters} if total_parameters is not None else {})}
    (directory / SAFE_WEIGHTS_INDEX_NAME).write_text(
        json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n"
    )


class SafetensorsWriter:
    """One safetensors file: the header at open, then ``write`` each tensor in the order given.

    ``close`` checks every tensor arrived: a file missing one would load with a hole (transformers
    reads byte ranges it trusts).
    """

    def __init__(self, path: Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> None:
        self.path, self.specs, self._next = Path(path), list(specs), 0
        header: dict[str, Any] = {}
        offset = 0
        for s in self.specs:
            header[s.name] = {
                "dtype": DTYPES[s.dtype][0],
                "shape": list(s.shape),
                "data_offsets": [offset, offset + s.nbytes],
            }
            offset += s.nbytes
        if len(header) != len(self.specs):
            raise ValueError(f"{self.path.name}: a tensor name appears twice")
        header["__metadata__"] = dict(metadata or {"format": "pt"})
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
        self._fh = open(self.path, "wb")
        self._fh.write(struct.pack("<Q", len(raw)))
        self._fh.write(raw)

    @property
    def done(self) -> bool:
        return self._next == len(self.specs)

    def write(self, name: str, tensor) -> None:
        """Append ``tensor`` (on the host, contiguous or not), which must be the next tensor the header names."""
        if self.done:
            raise ValueError(f"{self.path.name}: {name} is one tensor more than the header holds")
        want = self.specs[self._next]
        got = TensorSpec.of(name, tensor.shape, tensor.dtype)
        if got != want:
            raise ValueError(f"{self.path.name}: expected {want} next, got {got}")
        if tensor.device.type != "cpu":
            raise ValueError(f"{self.path.name}: {name} is on {tensor.device}; copy it to the host first")
        # Raw bytes in memory order (little-endian on every platform torch runs on); no numpy bf16 needed.
        flat = tensor.detach().contiguous().reshape(-1)
        self._fh.write(memoryview(flat.view(_byte_dtype()).numpy()) if flat.numel() else b"")
        self._next += 1

    def close(self) -> None:
        self._fh.close()
        if not self.done:
            missing = [s.name for s in self.specs[self._next :]]
            raise ValueError(f"{self.path.name}: {len(missing)} tensor(s) never written, first {missing[0]}")


class ShardedWriter:
    """Every file of ``shard_layout``, one open at a time: ``write`` the tensors in ``specs`` order
    (the next file opens when the last is full); ``close`` writes the index."""

    def __init__(
        self, directory: Path, specs: Sequence[TensorSpec], max_shard_bytes: int, total_parameters: int | None = None
    ) -> None:
        self.directory, self.total_parameters = Path(directory), total_parameters
        self.layout = shard_layout(specs, max_shard_bytes)
        self._pending = list(self.layout)
        self._current: SafetensorsWriter | None = None
        self.bytes_written = 0

    def _open_next(self) -> SafetensorsWriter:
        if self._current is not None:
            self._current.close()
        if not self._pending:
            raise ValueError(f"{self.directory}: more tensors than the snapshot's layout holds")
        file, specs = self._pending.pop(0)
        self._current = SafetensorsWriter(self.directory / file, specs)
        return self._current

    def write(self, name: str, tensor) -> None:
        current = self._current if self._current is not None and not self._current.done else self._open_next()
        current.write(name, tensor)
        self.bytes_written += current.specs[current._next - 1].nbytes

    def abort(self) -> None:
        """Close the open file without checks (a failed snapshot: the caller removes the folder)."""
        if self._current is not None:
            self._current._fh.close()

    def close(self) -> None:
        while self._pending:  # a file no tensor reached: its own close names what is missing
            self._open_next()
        if self._current is not None:
            self._current.close()
        write_index(self.directory, self.layout, self.total_parameters)


def _byte_dtype():
    import torch

    return torch.uint8
