"""msgpack encoding of the messages in replay/messages.py (and the control socket's ``Control``).

Every frame is a map {"v": schema version, "kind": message kind, "body": ...}.
Token ids, masks and logprobs (and reference logprobs, when a trajectory carries them)
travel as raw little-endian arrays (bin), not lists of ints. ``decode`` raises WireError with a reason for anything
malformed or of another schema version; receivers count and log those and
carry on.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import msgpack
import numpy as np

from replay.control_messages import Control
from replay.messages import SCHEMA_VERSION, InfraFault, Segment, Trajectory

# What travels as msgpack: the trajectory stream and the control socket. Interface updates and
# tag summaries cross between actors through Ray, which pickles them.
KINDS: dict[str, type] = {
    "trajectory": Trajectory,
    "control": Control,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}
# (field, numpy dtype) of the arrays sent as raw bytes
_ARRAYS = (("token_ids", "<i4"), ("loss_mask", "<u1"), ("logprobs", "<f4"))
# ... and those a trajectory may leave out (None travels as nil)
_OPTIONAL_ARRAYS = (("reference_logprobs", "<f4"),)
_ARRAY_NAMES = {name for name, _ in _ARRAYS + _OPTIONAL_ARRAYS}


class WireError(ValueError):
    """A frame that cannot be accepted (malformed, unknown kind, other version)."""


def encode(message: Any) -> bytes:
    kind = _KIND_OF.get(type(message))
    if kind is None:
        raise TypeError(f"not a wire message: {type(message).__name__}")
    if isinstance(message, Trajectory):
        # Field by field: asdict() would deep-copy the token lists element by
        # element (about 10 ms for 2K tokens) only for them to be replaced.
        body = {f.name: getattr(message, f.name) for f in fields(message) if f.name not in _ARRAY_NAMES}
        body["segments"] = [asdict(seg) for seg in message.segments]
        body["infra_fault"] = None if message.infra_fault is None else asdict(message.infra_fault)
        for name, dtype in _ARRAYS:
            body[name] = np.asarray(getattr(message, name), dtype=dtype).tobytes()
        for name, dtype in _OPTIONAL_ARRAYS:
            value = getattr(message, name)
            body[name] = None if value is None else np.asarray(value, dtype=dtype).tobytes()
    else:
        body = asdict(message)
    return msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, "body": body}, use_bin_type=True)


def decode(frame: bytes) -> Any:
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise WireError(f"not msgpack: {exc.__class__.__name__}: {exc}") from None
    if not isinstance(obj, dict) or set(obj) != {"v", "kind", "body"}:
        raise WireError("frame must be a map with keys v, kind, body")
    if obj["v"] != SCHEMA_VERSION:
        raise WireError(f"schema version {obj['v']!r}, expected {SCHEMA_VERSION}")
    cls = KINDS.get(obj["kind"])
    if cls is None:
        raise WireError(f"unknown message kind {obj['kind']!r}")
    body = obj["body"]
    if not isinstance(body, dict):
        raise WireError("body must be a map")
    try:
        if cls is Trajectory:
            for name, dtype in _ARRAYS:
                raw = body[name]
                if not isinstance(raw, bytes) or len(raw) % np.dtype(dtype).itemsize:
                    raise WireError(f"{name} must be raw {dtype} bytes")
                body[name] = np.frombuffer(raw, dtype=dtype).tolist()
            for name, dtype in _OPTIONAL_ARRAYS:
                raw = body.get(name)
                if raw is not None and (not isinstance(raw, bytes) or len(raw) % np.dtype(dtype).itemsize):
                    raise WireError(f"{name} must be raw {dtype} bytes or nil")
                if raw is not None:
                    body[name] = np.frombuffer(raw, dtype=dtype).tolist()
            body["segments"] = [Segment(**s) for s in body["segments"]]
            if body.get("infra_fault") is not None:  # a map {kind, message}; an unknown kind is refused
                body["infra_fault"] = InfraFault(**body["infra_fault"])
            message = Trajectory(**body)
            message.validate()
            return message
        return cls(**body)
    except WireError:
        raise
    except (TypeError, KeyError, ValueError) as exc:
        raise WireError(f"bad {obj['kind']} body: {exc}") from None
