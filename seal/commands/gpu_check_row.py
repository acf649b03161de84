"""One row of `seal gpu-check`'s table and the import probe every row uses: below both
gpu_check.py (the table) and gpu_check_rows.py (issue 46's rows), so neither imports the other back."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    check: str
    status: str  # ok | FAIL | skipped: <why>
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
