"""Bounds on oneDNN's shape-keyed caches in a learner process.

A bf16 learner on CPU runs its matmuls through oneDNN, via PyTorch's ideep layer; both keep a cache
keyed by tensor shapes: ideep's computations (``LRU_CACHE_CAPACITY``, 1024 by default) and oneDNN's
primitives (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1024). A learner meets new shapes every step (each
batch's token counts), so both fill with entries no later step reuses, each holding its buffers:
the soak's learner grew 36% over 42 minutes, and a probe with a new shape each step from 330 MB to
1.6 GB in 150 steps; fp32 (no oneDNN matmuls) stays flat. A step's own reuse (the same shapes in
every layer) needs a few dozen entries. Measured on the tiny model, bf16, a new packed group of 4
each step: capacity 64 for both stays flat at 371 MB and steps as fast as 1024 (0.172 s against
0.174 s); 16 for both stays flat at 330 MB but steps 15% slower.

ideep's cache is kept per calling thread: a rank runs all its torch calls on one thread
(learner/torch_thread.py), so it holds one such cache, not one per thread of Ray's pool.

Both are read from the environment once, when the process first uses the cache, so the bound must
be set before the learner's first bf16 op: ``Learner`` and ``LearnerRank`` call ``bound_caches``
first. A value set by the user is kept.
"""

from __future__ import annotations

import os

CACHE_CAPACITY = 64
VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_caches(capacity: int = CACHE_CAPACITY) -> dict[str, str]:
    """Set both capacities in this process's environment unless already set; returns what holds."""
    for name in VARIABLES:
        os.environ.setdefault(name, str(capacity))
    return {name: os.environ[name] for name in VARIABLES}
