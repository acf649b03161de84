"""The pipeline `seal rehearse` runs: seal/run/pipeline.py's, unchanged in what it does, with read-outs
of what a report needs and the run does not record (seal/commands/rehearse.py drives it).

- the weight group: its world size, backend and the ranks each replica's workers took (the
  fleet's ``join_weight_group`` answer, which the weight publisher waits on and drops);
- per replica, every weight version it confirmed and its canary's max |logprob difference|
  from the learner's at that version (the run's metrics keep only the max over replicas);
- the learner ranks' nodes and ZeRO shares (a rank's held parameters against the whole model:
  what shows its training group formed with the world size asked for).

The read-outs wrap the fleet's own methods on this run's fleet object and call them unchanged;
the canary difference is computed again from the replica's answer (the same max |a - b|).
"""

from __future__ import annotations

import time
from typing import Any

from seal.run.pipeline import Pipeline
from seal.runtime.placement import actor_nodes
from seal.runtime.publisher import WeightPublisher


class ProbedPublisher(WeightPublisher):
    """The pipeline's publisher, recording each weight group it forms."""

    def __init__(self, *args, **kwargs) -> None:
        self.weight_groups: list[dict[str, Any]] = []
        super().__init__(*args, **kwargs)

    def form_group(self) -> None:
        import ray

        fleet = self.fleet
        join = fleet.join_weight_group
        seen: dict[str, Any] = {}

        def on_join(host, port, backend, timeout_s):  # the publisher passes learner.timeout_s
            world, refs = join(host, port, backend, timeout_s)
            seen.update(world=world, refs=refs, backend=backend, names=list(fleet.names))
            return world, refs

        fleet.join_weight_group = on_join
        try:
            super().form_group()
        finally:
            del fleet.join_weight_group  # the class's own method again
        ranks = ray.get(seen["refs"])  # already awaited by the publisher: their answers
        self.weight_groups.append(
            {
                "world_size": seen["world"],
                "backend": seen["backend"],
                "ranks": {"learner rank 0": [0], **dict(zip(seen["names"], ranks))},
                "tensors": len(self.group_meta or []),
            }
        )


class RehearsalPipeline(Pipeline):
    publisher_type = ProbedPublisher

    def _start(self, resume) -> None:
        self.updates: dict[str, dict[int, dict[str, Any]]] = {}  # replica -> version -> record
        self.expected: dict[int, list[float]] = {}  # version -> the learner's canary logprobs
        self._watch_fleet()
        super()._start(resume)

    @property
    def weight_groups(self) -> list[dict[str, Any]]:
        """Each weight group formed: world size, backend, ranks per replica, tensors a round."""
        publisher = getattr(self, "publisher", None)
        return publisher.weight_groups if publisher is not None else []

    # ------------------------------------------------------------------ read-outs
    def _watch_fleet(self) -> None:
        import ray

        fleet = self.actors.generators
        published, poll, expect = fleet.published, fleet.poll_canaries, fleet.expect

        def on_published(ref):
            entry = fleet.pending.get(ref)
            seconds = published(ref)
            if entry is not None:
                name, version, _ = entry
                self.updates.setdefault(name, {})[version] = {
                    "version": version,
                    "confirmed": seconds is not None,
                    "update_s": seconds,
                    "canary_diff": None,
                }
            return seconds

        def on_poll():
            before = dict(fleet.canaries)
            poll()
            for ref, (name, version, want) in before.items():
                if ref in fleet.canaries:
                    continue
                try:
                    got = ray.get(ref, timeout=0)
                except Exception:  # the replica died: its record stays without a canary
                    continue
                diff = (
                    float("inf") if len(got) != len(want) else max((abs(a - b) for a, b in zip(got, want)), default=0.0)
                )
                self.updates.setdefault(name, {}).setdefault(
                    version, {"version": version, "confirmed": True, "update_s": None}
                )
                self.updates[name][version]["canary_diff"] = diff

        def on_expect(version, logprobs):
            self.expected[int(version)] = list(logprobs)
            return expect(version, logprobs)

        fleet.published, fleet.poll_canaries, fleet.expect = on_published, on_poll, on_expect

    # ------------------------------------------------------------------ after the steps
    def drain(self, timeout_s: float) -> None:
        """Wait for the updates and canaries still in flight (the last version's), so every replica's
        record is complete; a learner call still pending (the broadcast) is checked too."""
        import ray

        fleet = self.actors.generators
        deadline = time.monotonic() + timeout_s
        while (fleet.pending or fleet.canaries) and time.monotonic() < deadline:
            ray.wait(list(fleet.pending) + list(fleet.canaries), num_returns=1, timeout=1.0)
            for ref in [r for r in list(fleet.pending) if ray.wait([r], timeout=0)[0]]:
                self.publisher.published(ref)
            fleet.poll_canaries()
        self.actors.learners._check_pending()  # a broadcast still running: its failure surfaces here

    def learner_ranks(self) -> list[dict[str, Any]]:
        """Per rank: node id, IP, pid, and its share of the model's parameters (ZeRO-3: 1 / world); a group
        closed by a failure (its actors gone) still says where its ranks ran, without shares."""
        group = self.actors.learners
        nodes = list(group.nodes)
        if len(group.actors) != len(nodes):
            return [{**node, "rank": r} for r, node in enumerate(nodes)]
        shares = group.param_shares()
        return [
            {**node, "rank": r, "held": s["held"], "total": s["total"]}
            for r, (node, s) in enumerate(zip(nodes, shares))
        ]

    def replica_nodes(self) -> dict[str, dict[str, str]]:
        fleet = self.actors.generators
        ids, ips = actor_nodes(fleet.handles, key="NodeID"), actor_nodes(fleet.handles)
        return {name: {"node_id": ids[name], "ip": ips[name]} for name in fleet.names}
