"""The learner's weights to every generator replica, and the check that they arrived.

Two routes (``generator.weight_sync``): ``reload`` gathers the weights into the object store
(buckets in the generator's dtype) and each replica loads them; ``broadcast`` sends them over a
group of the learner's rank 0 and every replica's workers (gloo on CPU, NCCL on GPU; 1 +
replicas x TP ranks), as verl and OpenRLHF do. After each update every replica scores a fixed
prompt (the canary) and must match the learner's logprobs. A replica that fails, overruns its
update or restarts gets the latest weights before it serves again (seal/runtime/generator_fleet.py).

``acked`` is the version every serving replica has: admission counts staleness from it.
"Publish" means this, weights to the replicas; writing a frozen snapshot's weights to disk is the
learner's ``save_snapshot`` (seal/run/run_state.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from seal.runtime.calls import REPLICA_QUERY_TIMEOUT_S, bounded_get
from weights.model_assets import load_tokenizer

if TYPE_CHECKING:
    from seal.runtime.generator_fleet import GeneratorFleet
    from seal.runtime.learner_group import LearnerGroup

log = logging.getLogger(__name__)
# Scored by the learner and by every replica after each update (the weight-sync canary).
CANARY_TEXT = (
    "The canary checks that every generator replica loaded the learner's weights: "
    "call get_weather(city='Paris') and report the temperature in Celsius."
)
CANARY_TOKENS = 48
JOIN_GRACE_S = 60.0  # beyond learner.timeout_s, for a weight-group join's call around its rendezvous


class WeightPublisher:
    def __init__(
        self,
        fleet: GeneratorFleet,
        learners: LearnerGroup,
        version: int,
        broadcast: bool,
        backend: str,
        canary_model: str | None,
        canary_max_diff: float,
    ) -> None:
        """``version``: the policy version the run starts at; ``canary_model``: the tokenizer the
        canary prompt is encoded with (None: no canary)."""
        self.fleet, self.learners = fleet, learners
        self.broadcast, self.backend = broadcast, backend
        self.version = version  # the learner's: the latest published, or about to be
        self.acked = version
        # The manifest of the last weights published through the object store, and their version:
        # holding it keeps their buckets in the store for replicas that restore or join later.
        self.manifest: Any = None
        self.manifest_version = 0
        self.group_meta: list | None = None  # the broadcast group's tensor layout (learner rank 0's answer)
        self.in_flight: dict[Any, int] = {}  # one replica's update ref -> version (the fleet knows which replica)
        self.publish_s: float | None = None  # the latest completed publish: learner done -> generator loaded
        self.restores = 0  # replicas restored with the latest weights after a restart (scaling up not counted)
        # Weights go to the generator in its dtype (bf16 on a CPU with it: half the bytes).
        self.dtype = bounded_get(fleet.first.dtype.remote(), REPLICA_QUERY_TIMEOUT_S, "generator replica dtype")
        if canary_model is not None:
            fleet.canary_ids = list(load_tokenizer(canary_model)(CANARY_TEXT)["input_ids"])[:CANARY_TOKENS]
            fleet.canary_max_diff = canary_max_diff

    def start(self, resumed: bool) -> None:
        """Every replica at the start version: a resumed run's weights are loaded (one replica at a
        time, so their buckets are read once each); the broadcast group formed."""
        import ray

        if resumed:
            self.manifest, self.manifest_version = self.learners.weights(self.dtype), self.version
            for ref in self.fleet.publish(self.version, self.manifest):
                ready, _ = ray.wait([ref], timeout=self.fleet.update_timeout_s)
                if not ready:
                    name = self.fleet.pending[ref][0]
                    raise TimeoutError(
                        f"generator replica {name}: loading the resumed weights (v{self.version}) took "
                        f"over {self.fleet.update_timeout_s:.0f} s (generator.update_timeout_s)"
                    )
                self.fleet.published(ref)
        self.fleet.versions = {name: self.version for name in self.fleet.versions}
        if self.broadcast:
            self.form_group()

    def form_group(self) -> None:
        """The learner (rank 0) and every worker of every serving replica form the broadcast group.

        Rank 0's join is an ordered call: it may queue behind a training step (up to
        ``learner.step_timeout_s``). The replicas' joins run on a clock of ``learner.timeout_s``
        from their start, so they start only once rank 0's turn has come (it is listening);
        both sides are then waited for within that timeout."""
        host, port = self.learners.weight_group_address()
        world = self.fleet.weight_group_size()
        meta = self.learners.join_weight_group(host, port, world, self.backend, self.dtype)
        self.learners.wait_weight_group_turn()
        timeout_s = self.learners.settings.timeout_s
        _, joins = self.fleet.join_weight_group(host, port, self.backend, timeout_s)
        # The joins' own bound, plus the time to reach and answer the call (a replica closes its old group first).
        bound = timeout_s + JOIN_GRACE_S
        self.group_meta = bounded_get(meta, bound, "learner rank 0 joining the weight group")
        bounded_get(joins, bound, f"generator replicas {', '.join(self.fleet.names)} joining the weight group")

    def publish(self, version: int) -> list:
        """``version`` to every replica: by broadcast over the weight group, or through the object
        store (the learner's buckets, each read zero-copy and loaded before the next). A group
        missing a replica being restored cannot carry a round: that round goes through the object
        store. Returns the update refs (``published`` reads each)."""
        fleet = self.fleet
        self.version = version
        if fleet.canary_ids:  # the learner's view of the new weights, before they leave it
            fleet.expect(version, self.learners.canary_logprobs(fleet.canary_ids))
        if self.broadcast and not fleet.restoring:
            refs = fleet.publish(version, metadata=self.group_meta)
            self.learners.broadcast_weights()  # its failure surfaces at the learner group's next call
        else:
            if self.broadcast:
                log.warning(
                    "weight group incomplete (%s being restored): v%d goes through the object store",
                    ", ".join(sorted(fleet.restoring)),
                    version,
                )
            # Let the previous version's buckets go before the new ones are put (replicas still
            # loading them hold refs of their own): the store holds one version where it can.
            self.manifest = None
            self.manifest, self.manifest_version = self.learners.weights(self.dtype), version
            refs = fleet.publish(version, self.manifest)
        for ref in refs:
            self.in_flight[ref] = version
        return refs

    def wait(self, refs: list) -> None:
        """Sync mode: generation waits for the new weights, each update within the fleet's timeout."""
        import ray

        for ref in refs:
            ray.wait([ref], timeout=self.fleet.update_timeout_s)
            if ref in self.in_flight:
                self.published(ref)

    def published(self, ref) -> None:
        """One replica's update ended (confirmed or failed: the fleet takes a failed one out)."""
        self.in_flight.pop(ref, None)
        seconds = self.fleet.published(ref)
        if seconds is not None:
            self.publish_s = seconds
        self.acked = max(self.acked, self.fleet.acked())

    def collect(self, ready: list) -> None:
        for ref in ready:
            if ref in self.in_flight:
                self.published(ref)

    def latest(self) -> tuple[Any, int]:
        """What a restored or new replica loads: the last published manifest when the object
        store carried it; with broadcast (or before any publish) the learner's current weights."""
        if self.manifest is not None and not self.broadcast:
            return self.manifest, self.manifest_version
        return self.learners.weights(self.dtype), self.version

    def check(self, force: bool = False) -> None:
        """Replicas whose update is overdue are restarted; restarted ones get the latest weights
        before they serve again. ``force``: probe now and wait for the restores (a group just
        lost its replica)."""
        fleet = self.fleet
        fleet.overdue()
        for ref in [r for r in self.in_flight if r not in fleet.pending]:
            self.in_flight.pop(ref)  # given up as overdue
        fleet.poll_canaries()
        fleet.reap()
        restored = fleet.check(self.latest, force=force, every_s=0.5 if fleet.all_down() else 2.0)
        if restored:
            self.restores += len(restored)
            if self.broadcast:  # the restarted process left the group: re-form it with every replica
                self.form_group()
        self.acked = max(self.acked, fleet.acked()) if not fleet.all_down() else self.acked

    def scale(self, replicas: int) -> None:
        """Serve with ``replicas`` generator replicas (new ones load the latest weights first)."""
        self.fleet.scale(replicas, self.latest)
        if self.broadcast:  # the group's membership changed: re-form it with the replicas serving now
            self.form_group()
