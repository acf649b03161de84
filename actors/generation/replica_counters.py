"""A generator replica's counters and the pieces of its outputs (actors/generation/async_vllm_engine.py).

What ``stats()`` reports: the driver copies them into each step's metrics
(seal/run/step_metrics.py), per replica and summed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from replay.messages import Segment


@dataclass
class ReplicaCounters:
    requests: int = 0
    finished: int = 0
    continued: int = 0  # requests aborted by an update and continued on the new weights
    generated_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    outstanding: int = 0  # requests in the engine or waiting for an update to end
    outstanding_tokens: int = 0  # their prompt + new-token budget: the router's load measure
    updates: int = 0
    update_s: float = 0.0
    # vLLM refused to drop the prefix cache after an update (keep mode: frozen requests hold
    # blocks); requests issued later still never read those blocks (their cache_salt differs)
    prefix_cache_reset_refused: int = 0
    drain_timeouts: int = 0  # pause-mode updates whose drain hit its bound: the rest were continued as in abort
    failed_updates: int = 0  # loads that failed part way: requests in flight aborted, all held for a whole version
    busy_s: float = 0.0  # time with at least one request outstanding
    started: float = field(default_factory=time.perf_counter)
    # Drawn at start: a replica Ray restarted counts from 0 again, and the driver's run-long token
    # count (replay/token_ledger.py, GeneratorCount) tells the new process from the old by it.
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    _busy_since: float | None = None

    def enter(self, tokens: int) -> None:
        if self.outstanding == 0:
            self._busy_since = time.perf_counter()
        self.requests += 1
        self.outstanding += 1
        self.outstanding_tokens += tokens

    def leave(self, tokens: int) -> None:
        self.outstanding -= 1
        self.outstanding_tokens -= tokens
        if self.outstanding == 0 and self._busy_since is not None:
            self.busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    def stats(self, policy_version: int) -> ReplicaStats:
        """What the async replica's ``stats()`` answers: these counters as of now."""
        busy = self.busy_s + (time.perf_counter() - self._busy_since if self._busy_since is not None else 0.0)
        return ReplicaStats(
            instance=self.instance,
            policy_version=policy_version,
            requests=self.requests,
            generated_tokens=self.generated_tokens,
            outstanding=self.outstanding,
            outstanding_tokens=self.outstanding_tokens,
            busy_s=busy,
            updates=self.updates,
            update_s=self.update_s,
            wall_s=time.perf_counter() - self.started,
            batches=None,  # continuous batching: no batches to count
            finished=self.finished,
            continued=self.continued,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            prefix_cache_hit_rate=self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            prefix_cache_reset_refused=self.prefix_cache_reset_refused,
            drain_timeouts=self.drain_timeouts,
            failed_updates=self.failed_updates,
        )


@dataclass(frozen=True, kw_only=True)
class ReplicaStats:
    """A replica's ``stats()`` (actors/generation/async_vllm_engine.py AsyncVllmGenerator's, server.py
    GeneratorServer's), as the driver reads it (seal/runtime/generator_fleet.py): the counters both
    engines keep, the blocking engine's batches, and the async engine's own, which the blocking
    engine reports as 0 (None for its prefix cache hit rate: it keeps no prefix cache statistics)."""

    instance: str  # drawn at the process's start: a restart is a new one (replay/token_ledger.py)
    policy_version: int
    requests: int
    generated_tokens: int
    outstanding: int  # requests in the engine or waiting
    outstanding_tokens: int  # their prompt + new-token budget (0 where the engine does not count it)
    busy_s: float
    updates: int
    update_s: float
    wall_s: float
    batches: int | None  # the blocking engine's generate calls (None: the async engine batches continuously)
    finished: int
    continued: int  # requests aborted by an update and continued on the new weights
    prompt_tokens: int
    cached_prompt_tokens: int
    prefix_cache_hit_rate: float | None
    prefix_cache_reset_refused: int
    drain_timeouts: int
    failed_updates: int


def version_of(label: str | None, default: int) -> int:
    try:
        return int(label) if label is not None else default
    except ValueError:  # vLLM's "default" before the first set_weight_version
        return default


def merge_spans(spans: list[Segment]) -> list[Segment]:
    """Adjacent spans of one version become one (a continued piece often starts on the same version)."""
    out: list[Segment] = []
    for s in spans:
        if s.end == s.start and out:
            continue
        if out and out[-1].policy_version == s.policy_version and out[-1].end == s.start:
            out[-1] = Segment(out[-1].start, s.end, s.policy_version)
        else:
            out.append(s)
    return out
