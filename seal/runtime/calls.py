"""Remote calls the driver waits on, each with a bound and an error that names who and when."""

from __future__ import annotations

from typing import Any

# The coordinator answers from memory; ending a round in sync mode also waits for its interface
# push to reach every env actor (each push bounded there): minutes mean it is gone or stuck.
COORDINATOR_TIMEOUT_S = 300.0
# A replica answers a property (its dtype) as soon as its engine is up, which ActorSet awaited.
REPLICA_QUERY_TIMEOUT_S = 120.0


def bounded_get(ref: Any, timeout_s: float, what: str) -> Any:
    """``ray.get(ref)`` within ``timeout_s``; past it a TimeoutError naming ``what`` (the actor,
    the call and the step), never a silent wait."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(f"{what}: no answer in {timeout_s:.0f} s") from None
