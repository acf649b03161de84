"""The run directory every `seal train` writes (config, overrides, seed, code version)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any


def code_version(repo: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def create_run_dir(requested: str | None, cfg, overrides: list[str]) -> Path:
    from omegaconf import OmegaConf

    repo = Path(__file__).resolve().parents[2]
    path = Path(requested) if requested else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "overrides": overrides,
        "seed": cfg.seed,
        "code_version": code_version(repo),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    run_file = path / "run.json"
    if run_file.is_file():  # a resumed run: keep the original record, log the continuation
        record = json.loads(run_file.read_text())
        record.setdefault("resumed", []).append(meta)
        (path / f"config.resume{len(record['resumed'])}.yaml").write_text(OmegaConf.to_yaml(cfg))
    else:
        record = meta
        (path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    run_file.write_text(json.dumps(record, indent=2))
    return path
