"""Pruning a learner checkpoint directory: DeepSpeed adds one tag folder per save."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

_TAG = re.compile(r"step(\d+)")


def tags_to_prune(names: list[str], keep: int) -> list[str]:
    """The step tags beyond the newest ``keep`` (by step number); other names are never touched."""
    tags = sorted((n for n in names if _TAG.fullmatch(n)), key=lambda n: int(_TAG.fullmatch(n)[1]))
    return tags[:-keep] if keep > 0 else []


def prune_tags(path: Path, keep: int) -> list[str]:
    gone = tags_to_prune([p.name for p in path.iterdir() if p.is_dir()], keep)
    for name in gone:
        shutil.rmtree(path / name, ignore_errors=True)
    return gone
