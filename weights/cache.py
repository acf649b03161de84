"""Where SEAL caches model assets: the embedded and tiny models, the twins, the fetched tokenizers."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``SEAL_CACHE``, or ~/.cache/seal."""
    return Path(os.environ.get("SEAL_CACHE", Path.home() / ".cache" / "seal"))
