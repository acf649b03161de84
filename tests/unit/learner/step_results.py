"""A learner step's result for tests of what reads it (the driver's row, the learner steps)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from learner.step_result import LearnerStepResult


def step_result(**values: Any) -> LearnerStepResult:
    """``values`` as given, every other field 0 (its optional statistics None)."""
    zero = {f.name: None if "None" in str(f.type) else 0 for f in fields(LearnerStepResult) if f.name != "tag_weights"}
    return LearnerStepResult(**{**zero, **values})
