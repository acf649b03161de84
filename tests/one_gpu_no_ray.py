"""A pytest plugin (``-p tests.one_gpu_no_ray``) that makes this process look like a one-GPU box
without Ray: ``torch.cuda`` reports one device and ``import ray`` fails as if it were not installed.
tests/unit/seal/commands/test_gpu_check.py runs the GPU tests under it, so a CPU machine shows
what scripts/gpu_check.sh's ``pytest -m gpu`` row meets there: tests that skip, not ERROR rows.
Patched at import, which ``-p`` does before conftest.py asks whether CUDA is there."""

from __future__ import annotations

import sys

import torch

sys.modules["ray"] = None  # type: ignore[assignment]  # None in sys.modules: import raises ImportError
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
