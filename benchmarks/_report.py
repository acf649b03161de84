"""Shared by the benchmark scripts: where results go and how they are written."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(path: str, report: dict[str, Any]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
