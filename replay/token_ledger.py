"""Where every generated token went: the wasted-token ledger.

Each generated token (a ``loss_mask`` 1 of some trajectory) ends in exactly one
bucket, attributed by group when the group's fate is decided, not by when its
pieces arrived:

- ``trained``: members of a group the learner took (stand-ins generate nothing);
- ``stale_dropped``: members of a group past the staleness bound (stale_policy=drop);
- ``filtered``: members of a group with equal rewards (filter_groups=zero_variance);
- ``update_aborted``: cut by a weight update and thrown away. Always 0 here: abort mode
  continues a cut request's partial output on the new weights (actors/generation/async_vllm_engine.py),
  so those tokens stay in their episode; kept so the books name every way out;
- ``infra_failed``: episodes the system ended (trajectory ``infra_fault``), and every member of
  a group re-issued because too few members were left (trainer.min_group_size);
- ``lost``: rollouts of a group given up after a crash or the group deadline (what reached
  the replay queue of it: its partials, its stragglers), and what a group job that raised had
  generated (its generator replica gone: the env actor's count travels with the error);
- ``in_flight_end``: groups whose fate the run's end left open.

The run's totals are checked against the generator's own count (the replicas' ``generated_tokens``,
summed over the run by ``GeneratorCount``: a replica Ray restarts counts from 0 again, so the
count of each earlier instance is kept as last read): ``unattributed`` is the difference. It is 0
unless tokens left with a crashed env actor (counted by the engine, never delivered), with a crashed
replica (delivered, but generated after the replica's last reading: the difference goes negative),
or with a request cut by trainer.episode_deadline_s (the engine finishes it; nobody reads it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

BUCKETS = ("trained", "stale_dropped", "filtered", "update_aborted", "infra_failed", "lost", "in_flight_end")


def generated(trajectories: Iterable[Any]) -> int:
    return sum(t.num_generated_tokens for t in trajectories)


class TokenLedger:
    def __init__(self) -> None:
        self._step: Counter[str] = Counter()
        self._run: Counter[str] = Counter()

    def add(self, bucket: str, tokens: int) -> None:
        if bucket not in BUCKETS:
            raise ValueError(f"unknown token bucket {bucket!r} ({', '.join(BUCKETS)})")
        if tokens < 0:
            raise ValueError(f"a bucket takes a count >= 0, got {tokens} for {bucket}")
        self._step[bucket] += tokens
        self._run[bucket] += tokens

    def add_group(self, bucket: str, group: Any) -> None:
        """A decided group (replay.queue.Group): its members to ``bucket``, its infra-faulted ones to infra_failed."""
        self.add(bucket, generated(group.trajectories))
        self.add("infra_failed", generated(group.faulted))

    def close_step(self) -> dict[str, int]:
        """This step's buckets (every bucket, zeros included); the next step starts empty."""
        out = {b: self._step[b] for b in BUCKETS}
        self._step = Counter()
        return out

    def totals(self, generator_count: int | None) -> dict[str, Any]:
        """The run's buckets, their sum, the generator's own count and the difference between them."""
        return run_totals({b: self._run[b] for b in BUCKETS}, generator_count)


def run_totals(buckets: Mapping[str, int], generator_count: int | None) -> dict[str, Any]:
    attributed = sum(int(buckets.get(b, 0)) for b in BUCKETS)
    return {
        **{b: int(buckets.get(b, 0)) for b in BUCKETS},
        "attributed": attributed,
        "generated": generator_count,
        "unattributed": None if generator_count is None else generator_count - attributed,
    }


def reached_gradient(totals: Mapping[str, Any]) -> float | None:
    """The share of generated tokens that reached a gradient (trained / the generator's count,
    or / the attributed ones when the generator's count is unknown)."""
    whole = totals.get("generated") or totals.get("attributed")
    return totals["trained"] / whole if whole else None


class GeneratorCount:
    """The generator's own count of generated tokens over the run, from readings of the replicas'
    counters (each replica's ``stats()``: ``instance``, an id its process draws at start, and
    ``generated_tokens``). A restarted replica is a new instance counting from 0: the old instance's
    count, as last read, is kept, and so is a retired replica's."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, int]] = {}  # replica -> (instance, its count at the latest reading)
        self._earlier = 0  # what restarted replicas' earlier instances had counted when last read

    def read(self, replicas: Mapping[str, tuple[str, int]]) -> None:
        """One reading: replica name -> its instance and generated tokens (the replicas that answered)."""
        for name, (instance, count) in replicas.items():
            seen = self._last.get(name)
            # A count that went back is a restart too (a replica whose stats name no instance).
            if seen is not None and (seen[0] != instance or count < seen[1]):
                self._earlier += seen[1]
            self._last[name] = (instance, count)

    @property
    def total(self) -> int:
        return self._earlier + sum(count for _, count in self._last.values())
