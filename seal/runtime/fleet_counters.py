"""What the generator fleet counts for the step's metrics row (``FleetCounters``), and the
weight-sync canary's measure (``canary_gap``): pure parts of seal/runtime/generator_fleet.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class FleetCounters:
    update_timeouts: int = 0  # updates not confirmed in time (the replica was restarted)
    restores: int = 0  # restarted replicas given the latest weights
    retired: int = 0
    failed_replicas: list[str] = field(default_factory=list)  # named in the metrics of the step they failed in
    canary_failures: int = 0  # replicas whose logprobs after an update did not match the learner's
    canary_max_diff: float | None = None  # max |logprob difference| over the canaries since the last metrics row
    engine_restarts: int = 0  # replicas restarted because their engine core had died in the live actor


def canary_gap(got: list[float], want: list[float]) -> float:
    """The largest |replica - learner| over the canary's logprobs; inf where they differ in length or
    either side holds a value that is not finite (a NaN skipped by ``max``, or first and compared
    False against the bound, would pass a broken replica)."""
    if len(got) != len(want) or not all(math.isfinite(x) for x in (*got, *want)):
        return math.inf
    return max((abs(a - b) for a, b in zip(got, want)), default=0.0)
